"""Warm-up until steady: at least ``min_warmup_steps`` (plus the recipe's extra for compile or autotuning), then windows
of steps until two consecutive windows agree within ``steady_tolerance`` (or ``max_warmup_steps``); or the minimum only,
the timed rounds that follow judging by the same rule whether it is steady (``WarmUp.round_is_warm_up``). Loader workers
are running and prefetching on the live endless iterator before timing starts. The first warm-up steps of a setup fresh
from its seeds are the loss guard's seeded trajectory.
"""

from __future__ import annotations

import math

import torch

from trainbench.core.harness.costs import spent
from trainbench.core.harness.watchdog import phase
from trainbench.core.method.measured import Measured
from trainbench.core.setups.guards import GUARD_STEPS

# Windows this long judge steadiness well enough: a model whose steps take STEADY_WINDOW_S / 2 seconds or more
# compares windows of 2 steps, not the 3 (5 on GPU) its profile asks for: a steady one warms up for 5 steps on CPU,
# not 7 (on GPU for its minimum of 10, not 11).
STEADY_WINDOW_S = 1.5


def _settled(step_times: list[float], window: int, tolerance: float) -> bool:
    """The last window of steps took within ``tolerance`` of the window before it. A window is ``window`` steps, or
    fewer (never under 2) where fewer of the typical (median) step already last ``STEADY_WINDOW_S``."""
    typical = sorted(step_times)[len(step_times) // 2] if step_times else 0.0
    if typical > 0:
        window = min(window, max(2, math.ceil(STEADY_WINDOW_S / typical)))
    if len(step_times) < 2 * window:
        return False
    last, before = sum(step_times[-window:]), sum(step_times[-2 * window:-window])
    return before > 0 and abs(last / before - 1.0) <= tolerance



class WarmUp:
    """A setup's warm-up, and how it ended, said in its result: steady, at its limit, or judged by its rounds."""

    def __init__(self, measured: Measured, extra_steps: int = 0):
        self._measured = measured
        self.extra_steps = extra_steps  # the recipe's, for compile or autotuning
        # A setup fresh from its seeds: its first warm-up steps are the loss guard's seeded trajectory (kept as
        # tensors, read after the warm-up)
        self._seeded: list[torch.Tensor] | None = [] if measured.training.steps_run == 0 else None
        # Warmed up to its minimum only, its first timed rounds judging whether it is steady (``run``)
        self._settling_in_rounds = False
        self._rounds_dropped = 0  # leading rounds found to be warm-up (``count_dropped``)
        self._rounds_dropped_beside = 0  # rounds dropped with the interleaved setup's rounds that were warm-up

    @property
    def done(self) -> bool:
        return self._measured.result.warmup_steps > 0

    def run(self, settle: bool = True, in_rounds: bool = False) -> None:
        """Warm up; ``settle=False``: only the minimum steps (a setup already measured once in this process).
        ``in_rounds``: the minimum steps here, and the timed rounds that follow judge whether the setup is steady by
        the rule that would have judged more warm-up steps (``round_is_warm_up``)."""
        m = self._measured
        with phase(f"{m.result.recipe}'s warm-up"), spent("warm-up", m.baseline):
            self._run(settle, in_rounds)

    def _run(self, settle: bool, in_rounds: bool) -> None:
        m = self._measured
        s, timer = m.settings, m.backend.timer
        start = timer()
        m.timed_step()
        m.record(first_step_s=timer() - start)
        self._keep_seeded_loss()
        done, times, window = 1, [], s.steady_window
        minimum = s.min_warmup_steps + self.extra_steps
        # Settled when the last window of steps took within the tolerance of the window before it, checked after
        # every step from the minimum on: the minimum's steps after the first count towards the windows, so a
        # setup that is steady from its second step stops after 1 + 2 windows (or the minimum), not after the
        # minimum and two more windows. A limit that leaves no room past the minimum judges nothing.
        settling = settle and not s.fixed_warmup and s.max_warmup_steps > minimum
        if settling and in_rounds and s.rounds >= 2:  # its rounds are the windows: one disagreeing with the next is warm-up
            self._settling_in_rounds, settling = True, False
            if self._seeded is not None:
                # The loss guard's seeded trajectory is the warm-up's first steps, run back to back: in the rounds,
                # the other setup's steps come between (and draw from the global generator a model may sample from).
                minimum = max(minimum, GUARD_STEPS)
        steady = False
        while done < minimum or (settling and not steady and done < s.max_warmup_steps):
            t0 = timer()
            m.timed_step()
            times.append(timer() - t0)
            done += 1
            self._keep_seeded_loss()
            steady = settling and done >= minimum and _settled(times, window, s.steady_tolerance)
        m.record(warmup_steps=done, warmup_steady=steady, warmup_s=timer() - start)
        self._keep_seeded_losses()
        if self._settling_in_rounds:
            return  # its rounds say how it settled
        if s.fixed_warmup:
            m.note(f"fixed warm-up of {done} steps (ranks step in lockstep)")
        elif not settle:
            m.note(f"warm-up of {done} steps: this setup settled when measured earlier in the session")
        elif not steady:
            m.note(f"warm-up did not settle within {s.max_warmup_steps} steps (tolerance {s.steady_tolerance:.0%})")

    def _keep_seeded_loss(self) -> None:
        loss = self._measured.last_loss
        if self._seeded is not None and len(self._seeded) < GUARD_STEPS and loss is not None:
            self._seeded.append(loss)

    def _keep_seeded_losses(self) -> None:
        """The warm-up's first steps' losses as the seeded trajectory (``Result.seeded_losses``), one sync each, after
        the warm-up."""
        if self._seeded is not None and len(self._seeded) == GUARD_STEPS:
            self._measured.record(seeded_losses=[float(loss) for loss in self._seeded])
        self._seeded = None

    def round_is_warm_up(self, rounds_told_apart: bool) -> bool:
        """Whether the first timed round is warm-up still, for a setup warmed up ``in_rounds``: the warm-up's rule on
        rounds for windows. Its first two rounds agreeing within the tolerance, it is steady from the first; the
        first disagreeing, it is warm-up (``Measurer.drop_first_round``) while the warm-up limit leaves room for
        another. ``rounds_told_apart``: each round's own figures are known (not so for a runner that reads its timer
        oddly)."""
        m = self._measured
        s, times = m.settings, m.result.round_step_times_s
        if self._settling_in_rounds and not rounds_told_apart:
            self._settling_in_rounds = False
            m.note("warm-up not judged steady: the rounds could not be told apart")
        if not self._settling_in_rounds or len(times) < 2:
            return False
        if times[0] > 0 and abs(times[1] / times[0] - 1.0) <= s.steady_tolerance:
            self._settling_in_rounds = False
            m.record(warmup_steady=True)
            return False
        if m.result.warmup_steps + s.steps_per_round > s.max_warmup_steps:
            self._settling_in_rounds = False
            m.note(f"warm-up did not settle within {s.max_warmup_steps} steps (tolerance {s.steady_tolerance:.0%})")
            return False
        return True

    def count_dropped(self, own: bool) -> None:
        """A first timed round taken as warm-up (``own``), or dropped beside the interleaved setup's that was."""
        if own:
            self._rounds_dropped += 1
        else:
            self._rounds_dropped_beside += 1

    def end_rounds(self) -> None:
        """After the rounds: how the warm-up ended, said."""
        m = self._measured
        if self._settling_in_rounds:  # one round: nothing to judge it by
            self._settling_in_rounds = False
            m.note(f"warm-up of {m.result.warmup_steps} steps, not judged steady: one timed round")
        dropped, beside = self._rounds_dropped, self._rounds_dropped_beside
        if m.baseline:
            return  # its case's note says it
        if dropped:
            m.note(f"its first {dropped} timed round{'s' if dropped > 1 else ''} taken as warm-up: each took more "
                   f"than {m.settings.steady_tolerance:.0%} longer or shorter than the next")
        if beside:
            m.note(f"{beside} round{'s' if beside > 1 else ''} dropped beside its baseline's, which were warm-up "
                   "(the rounds stay paired)")

    def rewarm(self) -> None:
        """A few untimed steps after other work ran in between (another setup's warm-up, the passes)."""
        m = self._measured
        with spent("warm-up", m.baseline):
            for _ in range(m.settings.min_warmup_steps):
                m.timed_step()
