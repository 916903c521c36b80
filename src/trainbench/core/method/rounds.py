"""Timing: a round is ``steps_per_round`` steps on the live iterator between two ``backend.timer()`` reads; the timer
synchronizes the device, so a round is end-to-end (data stalls count) with no sync inside it. Each round's CPU time,
data wait and items (``TrainingSpec.items``) are kept beside its step time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from trainbench.core.harness.costs import recharge, spent
from trainbench.core.harness.watchdog import phase
from trainbench.core.method.measured import Measured


class RoundRunner(Protocol):
    """Runs ``rounds`` timed rounds of ``steps_per_round`` calls; returns each round's mean step seconds."""

    def __call__(self, step: Callable[[], None], rounds: int, steps_per_round: int, timer: Callable[[], float]) -> list[float]: ...


def _round_cpu_times(marks: list[float | None], rounds: int, steps_per_round: int) -> list[float]:
    """CPU seconds per step of each round from the CPU clock read at each round's start and end ([] where the
    device has no CPU clock, or a runner read the timer other than twice a round)."""
    if len(marks) != 2 * rounds or any(m is None for m in marks):
        return []
    return [(marks[2 * i + 1] - marks[2 * i]) / steps_per_round for i in range(rounds)]


def run_rounds(step: Callable[[], None], rounds: int, steps_per_round: int, timer: Callable[[], float]) -> list[float]:
    """The plain round loop; identical in shape to pytest-benchmark's pedantic runner."""
    times = []
    for _ in range(rounds):
        start = timer()
        for _ in range(steps_per_round):
            step()
        times.append((timer() - start) / steps_per_round)
    return times


class RoundTimer:
    """A setup's timed rounds, appended to its result: each round's mean step time and CPU time, and the data wait
    and items per step of every round kept."""

    def __init__(self, measured: Measured):
        self._measured = measured
        self._timed_items: list[torch.Tensor] = []  # each timed step's items, summed after timing
        self._round_waits: list[float] = []  # each timed round's data wait, and how many items it kept
        self._round_items: list[int] = []
        self._in_round = False  # between a runner's timer reads at a round's start and its end

    def start(self) -> None:
        """Forget any timed rounds: rounds timed from here on are the case's rounds."""
        m = self._measured
        m.wait_s = 0.0
        self._timed_items = []
        self._round_waits, self._round_items = [], []
        self._in_round = False
        m.record(round_step_times_s=[], round_cpu_times_s=[], rounds=0, data_wait_s=0.0, items_per_step=None)

    def time(self, runner: RoundRunner, count: int) -> None:
        """``count`` rounds timed by ``runner``."""
        m = self._measured

        def step():
            before, items = m.wait_s, len(self._timed_items)
            m.timed_step()
            if self._in_round:  # runners may add steps outside their rounds
                self._count_items()
                self._round_waits[-1] += m.wait_s - before
                self._round_items[-1] += len(self._timed_items) - items

        cpu_marks: list[float | None] = []

        def timer() -> float:  # the runner reads it at each round's start and end: CPU time is read there too
            now = m.backend.timer()
            cpu_marks.append(m.backend.cpu_clock())
            self._in_round = not self._in_round
            if self._in_round:
                self._round_waits.append(0.0)
                self._round_items.append(0)
            return now

        # its phase closed before a round is moved to the warm-up's seconds
        with phase(f"{m.result.recipe}'s timed rounds"), spent("rounds", m.baseline):
            times = runner(step, count, m.settings.steps_per_round, timer)
            self._add(times, _round_cpu_times(cpu_marks, len(times), m.settings.steps_per_round))

    def time_one(self, rewarm_steps: int = 0) -> None:
        """One more timed round, appended to the result (for interleaved A/B timing), after ``rewarm_steps``
        untimed steps: a process that sat idle while another ran starts cold (its caches evicted, its
        OpenMP threads asleep), which would slow the first steps of its round."""
        m = self._measured
        s, timer = m.settings, m.backend.timer
        with spent("warm-up", m.baseline):
            for _ in range(rewarm_steps):
                m.timed_step()
        before, items_before = m.wait_s, len(self._timed_items)
        with phase(f"{m.result.recipe}'s timed rounds"), spent("rounds", m.baseline):
            start, cpu_start = timer(), m.backend.cpu_clock()
            for _ in range(s.steps_per_round):
                m.timed_step()
                self._count_items()
            round_time = (timer() - start) / s.steps_per_round
            cpu_end = m.backend.cpu_clock()
        self._round_waits.append(m.wait_s - before)
        self._round_items.append(len(self._timed_items) - items_before)
        self._add([round_time], _round_cpu_times([cpu_start, cpu_end], 1, s.steps_per_round))

    @property
    def told_apart(self) -> bool:
        """Whether each round's data wait and items are known (a runner that reads its timer oddly mixes them)."""
        return len(self._round_waits) == len(self._measured.result.round_step_times_s)

    def drop_first(self) -> None:
        """The first timed round taken as warm-up: its steps and time join the warm-up's, its timing, data wait and
        items leave the rounds' (and its seconds the rounds' share of the case's cost)."""
        m = self._measured
        s, r = m.settings, m.result
        first = r.round_step_times_s[0]
        del self._timed_items[:self._round_items.pop(0)]
        wait = self._round_waits.pop(0)
        times = r.round_step_times_s[1:]
        cpu = r.round_cpu_times_s[1:] if len(r.round_cpu_times_s) == len(r.round_step_times_s) else []
        m.record(round_step_times_s=times, rounds=len(times), round_cpu_times_s=cpu, data_wait_s=r.data_wait_s - wait,
                 items_per_step=self._items_per_step(), warmup_steps=r.warmup_steps + s.steps_per_round,
                 warmup_s=r.warmup_s + first * s.steps_per_round)
        recharge(first * s.steps_per_round, "rounds", "warm-up", m.baseline)

    def _count_items(self) -> None:
        """Keep the items of the step just timed (a tensor each: summed, with one sync, after the rounds)."""
        last_items = self._measured.training.last_items
        if last_items is not None:
            self._timed_items.append(last_items)

    def _items_per_step(self) -> float | None:
        """Mean items per timed step, in this process (None where the spec counts none)."""
        if not self._timed_items:
            return None
        return float(torch.stack([t.to("cpu") for t in self._timed_items]).sum()) / len(self._timed_items)

    def _add(self, times: list[float], cpu: list[float]) -> None:
        """Timed rounds (and their CPU seconds per step, [] where unknown) appended to the result's, its data wait and
        items per step those of every round kept (``_round_waits``, ``_timed_items``)."""
        r = self._measured.result
        all_times, all_cpu = [*r.round_step_times_s, *times], [*r.round_cpu_times_s, *cpu]
        self._measured.record(round_step_times_s=all_times, rounds=len(all_times), data_wait_s=sum(self._round_waits),
                              round_cpu_times_s=all_cpu if len(all_cpu) == len(all_times) else [],
                              items_per_step=self._items_per_step())
