"""How often a timed verdict is wrong where it is hardest to be right: a true value exactly at its edge.

A 95% interval claims that "ok" and "missed" (a budget at its limit), or "regressed" and "unchanged" (a change
exactly at a gate's or an A/B's threshold), are each claimed wrongly at most 2.5% of the time there. This module
checks that claim by simulation through the very functions that judge (``stats.judge_bound``,
``stats.judge_change`` with the intervals their callers compute) and the very sequence of looks a case gets
(``stats.look_alpha``: measured again while inconclusive, the rounds pooled), for

- ``lognormal`` noise: a few percent a round on each side, and a slow spell shared by the two rounds of a pair
  (the paired designs cancel it; the unpaired gate sees each run's own);
- ``committed`` noise: the rounds of committed runs (``rounds_of_runs``, ``noise_of_rounds``), each case's rounds over their median,
  drawn with replacement: real noise, with its slow rounds and skew.

``error_rates`` is what ``python -m trainbench error-rates`` tabulates and what the coverage test runs with
fewer trials. Torch-free and pytest-free; seeded, so a table is reproduced exactly.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from trainbench.core.records.stats import (
    ALPHA_SIDE,
    change_interval,
    judge_bound,
    judge_change,
    least_rounds,
    look_alpha,
    rank_tests,
    signed_rank_tests,
)

# The designs a timed verdict is made in: a budget's speed-up against its interleaved baseline (paired rounds),
# an absolute budget (one side's rounds against a limit), the gate (two runs' rounds, unpaired) and A/B (pairs).
DESIGNS = ("budget_paired", "budget_absolute", "gate", "ab")
# The verdicts that are wrong when the truth sits exactly at the edge, per design.
WRONG_AT_EDGE = {"budget_paired": ("ok", "missed"), "budget_absolute": ("ok", "missed"),
                 "gate": ("regressed", "unchanged"), "ab": ("regressed", "unchanged")}
ROUND_NOISE = 0.03  # a round's own noise, a side (log scale)
SPELL_NOISE = 0.05  # a slow spell both rounds of a pair share (log scale)
LIMIT = 1.3  # a budget's min_speedup (the edge the true speed-up sits at)
THRESHOLD = 0.05  # a gate's or A/B's samples/s threshold (the true change is a drop of exactly this)
GATE_ALPHA = 0.05  # the gate's and A/B's test level (compare.DEFAULT_ALPHA)


def design_rounds(design: str) -> str:
    """The round design (``stats.rounds_needed``) a verdict's design reads its rounds in."""
    return {"budget_paired": "paired", "ab": "paired", "budget_absolute": "single", "gate": "unpaired"}[design]


# A source of noise: (rng, n) -> n multiplicative factors for one side, and n factors a pair's two sides share.
Noise = Callable[[object, int], tuple[list[float], list[float]]]


def lognormal_noise(rng, n: int) -> tuple:
    return rng.normal(0.0, ROUND_NOISE, size=(2, n)), rng.normal(0.0, SPELL_NOISE, size=n)


def noise_of_rounds(population: list[float]) -> Noise:
    """Noise drawn from ``population`` (rounds over their case's median, log scale); no shared spell: a pair's
    rounds are drawn apart, so whatever slow rounds the population holds fall on one side."""
    logs = np.log(np.asarray(population, dtype=float))

    def draw(rng, n: int) -> tuple:
        return rng.choice(logs, size=(2, n)), np.zeros(n)

    return draw


def rounds_of_runs(records: Iterable, least: int = 5) -> list[float]:
    """Every timed round of ``records`` (``result.CaseRecord``s of saved runs, read by the store), as step time
    over its case's median step time: the real noise of the suite's rounds. Cases with fewer than ``least``
    rounds are left out (their median is too rough to divide by)."""
    ratios = []
    for record in records:
        times = [t for t in record.round_step_times_s if t > 0]
        if len(times) >= least:
            median = statistics.median(times)
            ratios.extend(t / median for t in times)
    return ratios


@dataclass(frozen=True)
class Cell:
    """The claims of ``trials`` simulated cases of one design at one round count, with or without looks."""

    design: str
    noise: str
    rounds: int
    planned_looks: int
    trials: int
    claims: dict[str, int]
    mean_rounds: float  # rounds a case measured on average (its cost): more where it was measured again

    def rate(self, verdict: str) -> float:
        return self.claims.get(verdict, 0) / self.trials

    def worst(self) -> float:
        """The larger of the two wrong-claim rates at the edge."""
        return max(self.rate(v) for v in WRONG_AT_EDGE[self.design])

    def as_dict(self) -> dict:
        return {"design": self.design, "noise": self.noise, "rounds": self.rounds,
                "planned_looks": self.planned_looks, "trials": self.trials, "claims": self.claims,
                "mean_rounds": self.mean_rounds, **{f"wrong_{v}": self.rate(v) for v in WRONG_AT_EDGE[self.design]}}


def _judge(design: str, current, baseline, alpha_side: float) -> str:
    """One look's verdict, through the functions the suite judges with."""
    if design in ("budget_paired", "budget_absolute"):
        ref = None if design == "budget_absolute" else baseline
        value = (statistics.median([c / b for c, b in zip(current, baseline)]) if ref is not None
                 else statistics.median(current))
        ok, why = judge_bound("samples_per_s", "min", LIMIT, value, list(current), None if ref is None else list(ref),
                              True, [None], alpha_side=alpha_side)
        return "inconclusive" if why else "ok" if ok else "missed"
    paired = design == "ab"
    ci = change_interval(list(current), list(baseline), paired=paired, alpha_side=alpha_side)
    if paired:
        p_worse, p_better = signed_rank_tests([c / b for c, b in zip(current, baseline)], True)
    else:
        p_worse, p_better = rank_tests(list(current), list(baseline), True)
    verdict, _ = judge_change(ci, p_worse, p_better, THRESHOLD, True, GATE_ALPHA, alpha_side=alpha_side)
    return verdict


def simulate(design: str, rounds: int, trials: int, noise: Noise, noise_name: str, planned_looks: int = 1,
             seed: int = 0) -> Cell:
    """``trials`` cases of ``design`` whose truth sits exactly at the edge, each measured ``rounds`` rounds a
    look and judged at each look (``stats.look_alpha``), measured again while inconclusive up to
    ``planned_looks`` looks (the gate's baseline run stays as it was; paired designs add pairs)."""
    rng = np.random.default_rng(seed)
    truth = LIMIT if design.startswith("budget") else 1.0 - THRESHOLD
    scale = 1.0 if design == "budget_absolute" else 100.0  # an absolute limit is the current side's own value
    claims: dict[str, int] = {}
    measured = 0
    for _ in range(trials):
        current, baseline = [], []
        if design == "gate":  # the stored run: measured once, in a session of its own (its own spells)
            own, shared = noise(rng, rounds)
            baseline = list(100.0 * np.exp(own[0] + shared))
        for look in range(1, planned_looks + 1):
            own, shared = noise(rng, rounds)
            if design == "gate":  # this session's rounds: spells of their own, none shared with the stored run
                current = [*current, *(scale * truth * np.exp(own[1] + shared))]
            else:  # a pair's two rounds share its spell
                baseline = [*baseline, *(100.0 * np.exp(own[0] + shared))]
                current = [*current, *(scale * truth * np.exp(own[1] + shared))]
            verdict = _judge(design, current, baseline, look_alpha(look, planned_looks))
            if verdict != "inconclusive":
                break
        measured += len(current)
        claims[verdict] = claims.get(verdict, 0) + 1
    return Cell(design, noise_name, rounds, planned_looks, trials, claims, measured / trials)


def error_rates(rounds: Iterable[int | None], trials: int, noises: dict[str, Noise], designs: Iterable[str] = DESIGNS,
                looks: Iterable[int] = (1, 2), seed: int = 0) -> list[Cell]:
    """Each design at each of ``rounds`` (None: the least it accepts) from the least it accepts, judged at one look
    and measured again up to each of ``looks``."""
    cells = []
    for design in designs:
        for planned in looks:
            least = least_rounds(design_rounds(design), planned)
            for n in dict.fromkeys(least if n is None else n for n in rounds):
                if n < least:
                    continue
                for name, noise in noises.items():
                    cells.append(simulate(design, n, trials, noise, name, planned, seed))
    return cells


def simulation_error(trials: int, rate: float = ALPHA_SIDE) -> float:
    """Two standard errors of a rate near ``rate`` from ``trials`` trials: the slack a table's figure is read with."""
    return 2 * math.sqrt(rate * (1 - rate) / trials)


def markdown_table(cells: list[Cell]) -> str:
    """The table ``results/error-rates`` keeps: per design, noise, round count and looks, each wrong-claim rate."""
    lines = ["| design | noise | rounds | looks | wrong claims at the edge | inconclusive | mean rounds |",
             "|---|---|---|---|---|---|---|"]
    for c in cells:
        wrong = ", ".join(f"{v} {c.rate(v):.1%}" for v in WRONG_AT_EDGE[c.design])
        lines.append(f"| {c.design} | {c.noise} | {c.rounds} | {c.planned_looks} | {wrong} | "
                     f"{c.rate('inconclusive'):.1%} | {c.mean_rounds:.1f} |")
    return "\n".join(lines) + "\n"
