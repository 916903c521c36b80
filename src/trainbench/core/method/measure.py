"""The measurement method: warm-up until steady, synchronized rounds, memory, work signals.

1. Warm-up (``warm_up``): at least ``min_warmup_steps`` (plus the recipe's extra for compile or
   autotuning), then windows of steps until two consecutive windows agree within
   ``steady_tolerance`` (or ``max_warmup_steps``). Loader workers are running and
   prefetching on the live endless iterator before timing starts.
2. Timing (``rounds``): a round is ``steps_per_round`` steps on the live iterator between two
   ``backend.timer()`` reads; the timer synchronizes the device, so a round is
   end-to-end (data stalls count) with no sync inside it.
3. Memory (``trainbench.core.analyses.step_memory``): a separate warm pass with reset allocator peaks; live tensor
   bytes and kept autograd nodes after each of a few steps (growth: a leak if > 0); then one step under
   PyTorch's ``MemTracker`` (or, for steps it cannot follow, by storage identity) that splits the
   tensor peak into parameters, gradients, optimizer state and activations.
4. Work (``trainbench.core.analyses.step_work``): one step under ``FlopCounterMode`` and an op counter (FLOPs, ops,
   syncs), plus the bytes each step copies to the device.

Each pass of 3 and 4 reads its batches from the start of the seeded stream, made again
(``passes.AfterTiming.window``), never from where the warm-up and the rounds left the live one: with
batches whose shapes vary (padding to each batch's longest sequence) their figures would
otherwise move with the rounds, the warm-up and what ran before.

``Measurer`` is the one object callers drive; the warm-up, the rounds and the passes each keep their own state.
"""

from __future__ import annotations


import torch

from trainbench.core.method.passes import AfterTiming
from trainbench.core.method.rounds import RoundRunner, RoundTimer, run_rounds
from trainbench.core.method.settings import DEFAULT_SETTINGS, MeasureSettings, with_overrides
from trainbench.core.method.warm_up import WarmUp
from trainbench.core.records.result import Result
from trainbench.core.setups.training import TrainingSetup
from trainbench.devices.device import Backend

__all__ = ["DEFAULT_SETTINGS", "MeasureSettings", "Measurer", "RoundRunner", "interleave_rounds", "measure", "run_rounds",
           "with_overrides"]


class Measurer:
    """Measures one training setup; ``run()`` returns a ``Result``.

    The pieces (``warm_up``, ``time_rounds``/``time_one_round``, ``measure_after_timing``)
    are public so the pytest plugin can drive them with its own runners.
    """

    def __init__(self, training: TrainingSetup, case: str, recipe_name: str, settings: MeasureSettings,
                 extra_warmup_steps: int = 0, profile_name: str = "", baseline: bool = False):
        self.training = training
        self.baseline = baseline  # the case's baseline: its phases are the baseline's share of the case's cost
        self.backend: Backend = training.backend
        self.settings = settings
        self._batches = training.batches()
        self.wait_s = 0.0  # seconds the live iterator's steps waited on the loader
        self.last_loss: torch.Tensor | None = None
        self.result = Result(
            case=case,
            workload=training.spec.name,
            recipe=recipe_name,
            profile=profile_name,
            batch_size=training.samples_per_step,
            config=training.config.record(),
            device=self.backend.identity(),
            steps_per_round=settings.steps_per_round,
            world_size=training.config.world_size,
            items_unit=training.spec.items_unit if training.spec.items is not None else None,
            notes=list(training.notes),  # what building the setup changed (e.g. which convolution biases)
        )
        self._warmup = WarmUp(self, extra_warmup_steps)
        self._rounds = RoundTimer(self)
        self._passes = AfterTiming(self)

    def record(self, **fields) -> None:
        """The result so far, with ``fields`` measured: each piece replaces it, none edits it in place."""
        self.result = self.result.replace(**fields)

    def note(self, note: str) -> None:
        self.result = self.result.with_note(note)

    def timed_step(self) -> None:
        """One step on the live iterator, recording the time blocked on the loader (on the clock rounds read)."""
        t0 = self.backend.clock()
        micro_batches = self.training.fetch(self._batches)
        self.wait_s += self.backend.clock() - t0
        self.step_on(micro_batches)

    def step_on(self, micro_batches: list) -> torch.Tensor:
        """One step on micro-batches fetched already; its loss is the last one (``finish``)."""
        self.last_loss = self.training.step(micro_batches)
        return self.last_loss

    # -- 1. warm-up ---------------------------------------------------------------
    def warm_up(self, settle: bool = True, in_rounds: bool = False) -> None:
        """Warm up; ``settle=False``: only the minimum steps (a setup already measured once in this process).
        ``in_rounds``: the minimum steps here, and the timed rounds that follow (``time_rounds``, ``interleave_rounds``)
        judge whether the setup is steady by the rule that would have judged more warm-up steps (``round_is_warm_up``)."""
        self._warmup.run(settle, in_rounds)

    @property
    def warmed_up(self) -> bool:
        return self._warmup.done

    def round_is_warm_up(self) -> bool:
        """Whether the first timed round is warm-up still, for a setup warmed up ``in_rounds`` (``WarmUp``)."""
        return self._warmup.round_is_warm_up(self._rounds.told_apart)

    def drop_first_round(self, own: bool = True) -> None:
        """The first timed round taken as warm-up: its steps and time join the warm-up's, its timing, data wait and
        items leave the rounds' (and its seconds the rounds' share of the case's cost). ``own=False``: dropped with
        the round beside it in interleaved timing, which was the warm-up."""
        self._rounds.drop_first()
        self._warmup.count_dropped(own)

    def end_rounds(self) -> None:
        """After the rounds: how the warm-up ended, said."""
        self._warmup.end_rounds()

    def rewarm(self) -> None:
        """A few untimed steps after other work ran in between (another setup's warm-up, the passes)."""
        self._warmup.rewarm()

    # -- 2. timing ----------------------------------------------------------------
    def time_rounds(self, runner: RoundRunner = run_rounds) -> None:
        """The rounds asked, timed by ``runner``. For a setup warmed up ``in_rounds``, while its first round is warm-up
        still (``round_is_warm_up``) that round is dropped and ``runner`` times one more."""
        self.start_rounds()
        self._rounds.time(runner, self.settings.rounds)
        while self.round_is_warm_up():
            self.drop_first_round()
            self._rounds.time(runner, 1)
        self.end_rounds()

    def start_rounds(self) -> None:
        """Forget any timed rounds: ``time_one_round`` calls from here on are the case's rounds."""
        self._rounds.start()

    def time_one_round(self, rewarm_steps: int = 0) -> None:
        """One more timed round, appended to the result (for interleaved A/B timing), after ``rewarm_steps``
        untimed steps (``RoundTimer.time_one``)."""
        self._rounds.time_one(rewarm_steps)

    # -- 3 and 4. after timing ---------------------------------------------------------
    PASS_FIELDS = AfterTiming.PASS_FIELDS

    def measure_after_timing(self) -> None:
        """The memory and work passes, ordered so that compiled code stays compiled (``AfterTiming.run``)."""
        self._passes.run()

    def measure_peaks(self) -> None:
        """Allocator peaks of a few steps as timed (CUDA; the CPU backend reports none)."""
        self._passes.peaks()

    def measure_memory(self) -> None:
        """Growth per step, then the tracked breakdown of the peak (both under dispatch modes)."""
        self._passes.memory_pass()

    def tracked_breakdown(self) -> dict[str, int]:
        """The tensor peak of one step split into parameters, gradients, optimizer state, activations...
        (``StepMemory.tracked_breakdown``)."""
        return self._passes.tracked_breakdown()

    def count_work(self) -> None:
        """FLOPs of the window's first step; ops and syncs per step over its first ``log_every`` steps."""
        self._passes.work_pass()

    def count_calls(self) -> None:
        """aten calls and device kernels of a step from PyTorch's profiler, and each op's self time where asked."""
        self._passes.calls()

    def profile(self, steps: int) -> dict | None:
        """``steps`` profiled steps of the window (``StepWork.profile``), or None where a profiler is already running."""
        return self._passes.work.profile(steps)

    def window_shapes_note(self) -> str | None:
        """The note of a spec whose batch shapes vary across the window the passes read, or None."""
        return self._passes.window_shapes_note()

    def reuse_passes(self, earlier: Result) -> None:
        """Take the memory and work figures of an earlier measurement of the same setup instead of re-running them."""
        self._passes.reuse(earlier)

    def finish(self) -> Result:
        if self.last_loss is not None:
            self.record(final_loss=float(self.last_loss))  # one sync, after all timing
        return self.result

    def run(self, runner: RoundRunner = run_rounds, passes_from: Result | None = None) -> Result:
        """The whole method (``passes_from``: an earlier measurement of this setup whose passes stand): warm-up to the
        minimum, the rounds judging when it ended (``warm_up(in_rounds=True)``), the passes."""
        self.warm_up(in_rounds=True)
        self.time_rounds(runner)
        if passes_from is not None:
            self.reuse_passes(passes_from)
        else:
            self.measure_after_timing()
        return self.finish()


def measure(training: TrainingSetup, case: str, recipe_name: str, settings: MeasureSettings, extra_warmup_steps: int = 0,
            profile_name: str = "", runner: RoundRunner = run_rounds) -> Result:
    """Measure a built training setup (one process) with the whole method."""
    return Measurer(training, case, recipe_name, settings, extra_warmup_steps, profile_name).run(runner)


def interleave_rounds(case: Measurer, baseline: Measurer) -> None:
    """Time a case's and its baseline's rounds interleaved, in ABBA order, after the case's warm-up and the baseline's
    few steps since (its minimum warm-up where it settled when measured earlier in the session and was not warmed yet).

    A setup warmed up to its minimum has its rounds for the warm-up rule's windows: while the first round of the
    case (or of a baseline warmed up so) disagrees with its second, that pair of rounds is warm-up and another pair
    is timed, so the rounds that stand are as many as asked and steady, without the windows' steps before them.

    A shared runner's speed drifts over seconds; timed back to back, a slow spell lands
    on one side of a speed-up and skews it by tens of percent. Alternating rounds puts
    both sides under the same conditions, so the ratio of the two is what a same-session
    budget should judge. The memory and work passes are not timed: the runner runs them
    with one setup alive at a time, so allocator peaks are each setup's own.
    """
    case.warm_up(in_rounds=True)
    if baseline.warmed_up:
        baseline.rewarm()
    else:  # a baseline that settled when measured earlier in the session: its minimum, right before the rounds
        baseline.warm_up(settle=False)
        baseline.training.check_loss("the end of warm-up")
    for m in (case, baseline):
        m.start_rounds()
    timed = 0
    while len(case.result.round_step_times_s) < case.settings.rounds:
        for m in ((baseline, case) if timed % 2 == 0 else (case, baseline)):
            m.time_one_round()
        timed += 1
        warm_up = [m.round_is_warm_up() for m in (case, baseline)]
        if any(warm_up):  # the pair goes: the rounds stay paired
            for m, own in zip((case, baseline), warm_up):
                m.drop_first_round(own)
    for m in (case, baseline):
        m.end_rounds()
