"""Can timing be judged? The one place that reads rounds statistically: intervals, tests, a busy machine, verdicts.

Every timed verdict asks this module: the gate (``compare``, rounds of two runs), A/B (``ab``, pairs), a timed
budget (``judge``, rounds against a limit) and the attribution of a change (``explain``, profiled steps). It owns

- the one bootstrap interval of a median change (``median_interval``: a ratio or a difference, paired or not)
  and the change it is centred on (``median_change``);
- the one-sided tests behind a gate's or A/B's direction (``rank_tests``, ``sign_tests``);
- whether an interval shows a change at all (``beyond_noise``);
- the busy-machine doubt (``busy_reason``), which no interval answers: a loaded machine slows its code;
- the judgement of a change against a threshold (``judge_change``) and of a value against a budget's limit
  (``judge_bound``), by one rule: a verdict either way is a claim, made only where the interval lies wholly on
  its side (``side_of``); an interval that reaches the edge is *inconclusive*, with the reason.

Deterministic signals (memory breakdown, FLOPs, bytes, ops, syncs) never come here: load cannot move them.
"""

from __future__ import annotations

import math
import statistics

from trainbench.core.metrics import is_timed

# Other processes used at least this share of our cores, on average, while a case ran: its rounds
# were contended (a 2-process CPU hog on 2 cores shows as ~1 CPU; a quiet runner as < 0.1).
BUSY_SHARE = 0.25
CONFIDENCE = 0.95
RESAMPLES = 2000
MIN_ROUNDS = 3  # per side, for an interval of timed rounds: fewer cannot place a change


def dispersion(values: list[float]) -> float | None:
    """Inter-quartile range / median of the rounds (None: fewer than 2)."""
    if len(values) < 2:
        return None
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / median if median else None


def median_change(current: list[float], baseline: list[float], paired: bool, relative: bool = True) -> float:
    """The change ``median_interval`` is the interval of: current / baseline (``relative``) or current - baseline,
    taken per pair and their median (``paired``: item i of each side ran next to each other), else of the medians."""
    def of(c, b):
        return c / b if relative else c - b

    if paired:
        return statistics.median(of(c, b) for c, b in zip(current, baseline))
    return of(statistics.median(current), statistics.median(baseline))


def median_interval(current: list[float], baseline: list[float], paired: bool,
                    relative: bool = True) -> tuple[float, float] | None:
    """95% bootstrap interval of ``median_change`` (None: fewer than 2 values a side, or no finite interval).

    ``paired``: the change is taken per pair and a slow spell that falls on both sides cancels in it; otherwise the
    two sides are resampled independently. The same values give the same interval (a seeded generator).
    """
    import numpy as np
    from scipy import stats

    if min(len(current), len(baseline)) < 2:
        return None
    cur, base = np.asarray(current, dtype=float), np.asarray(baseline, dtype=float)
    of = np.divide if relative else np.subtract
    rng = np.random.default_rng(0)
    if paired:
        changes = of(cur, base)
        if np.ptp(changes) == 0:  # every pair moved alike: that is the interval
            return float(changes[0]), float(changes[0])
        boot = stats.bootstrap((changes,), np.median, vectorized=True, n_resamples=RESAMPLES,
                               confidence_level=CONFIDENCE, method="percentile", rng=rng)
    else:
        if np.ptp(cur) == 0 and np.ptp(base) == 0:
            return float(of(cur[0], base[0])), float(of(cur[0], base[0]))

        def change(c, b, axis=-1):
            return of(np.median(c, axis=axis), np.median(b, axis=axis))

        boot = stats.bootstrap((cur, base), change, vectorized=True, paired=False, n_resamples=RESAMPLES,
                               confidence_level=CONFIDENCE, method="percentile", rng=rng)
    low, high = float(boot.confidence_interval.low), float(boot.confidence_interval.high)
    return (low, high) if math.isfinite(low) and math.isfinite(high) else None


def rank_tests(current: list[float], baseline: list[float], higher_is_better: bool) -> tuple[float, float]:
    """One-sided Mann-Whitney p-values that the current rounds are worse, and better, than the baseline's."""
    from scipy import stats

    worse_side, better_side = ("less", "greater") if higher_is_better else ("greater", "less")
    return (float(stats.mannwhitneyu(current, baseline, alternative=worse_side).pvalue),
            float(stats.mannwhitneyu(current, baseline, alternative=better_side).pvalue))


def sign_tests(ratios: list[float], higher_is_better: bool) -> tuple[float, float]:
    """One-sided sign-test p-values that the pairs' ratios (current / baseline) lean worse, and better."""
    from scipy import stats

    worse = sum((r < 1.0) if higher_is_better else (r > 1.0) for r in ratios)
    better = sum((r > 1.0) if higher_is_better else (r < 1.0) for r in ratios)
    return (float(stats.binomtest(worse, len(ratios), 0.5, alternative="greater").pvalue),
            float(stats.binomtest(better, len(ratios), 0.5, alternative="greater").pvalue))


def beyond_noise(ci: tuple[float, float] | None) -> bool:
    """Whether an interval of a difference excludes zero (no interval, from one sample a side: cannot tell)."""
    return ci is not None and side_of(ci, 0.0) is not None


def side_of(ci: tuple[float, float], edge: float) -> str | None:
    """Where an interval lies against ``edge``: wholly "above" it, wholly "below" it, or None (it reaches it)."""
    return "above" if ci[0] > edge else "below" if ci[1] < edge else None


def busy_reason(load: dict | None) -> str | None:
    """Why the machine was too busy to time on, from a ``host.LoadMeter`` record, or None."""
    if not load or load.get("other_cpus") is None or not load.get("cpus"):
        return None
    if load["other_cpus"] < BUSY_SHARE * load["cpus"]:
        return None
    average = load.get("load_average_1m")
    return (f"busy machine: other processes used {load['other_cpus']:.2f} of {load['cpus']} CPUs while it ran"
            + (f", load average {average[0]:.2f} -> {average[1]:.2f}" if average else ""))


def judge_change(ci: tuple[float, float] | None, p_worse: float, p_better: float, threshold: float,
                 higher_is_better: bool, alpha: float, doubts: tuple[str, ...] = ()) -> tuple[str, str | None]:
    """The one rule for a timed change read over rounds (the gate) or pairs (A/B): (verdict, why inconclusive).

    ``ci``: the 95% interval of current / baseline; ``p_worse``/``p_better``: one-sided tests that current is
    worse/better; ``doubts``: why the timing itself cannot be trusted (a busy machine), which no interval can
    answer. *unchanged* needs the whole interval inside the threshold (an equivalence test: "no change" is a claim
    too); *regressed*/*improved* need it wholly beyond the threshold, the test significant and no doubt; anything
    else is *inconclusive*, with the reason.
    """
    if ci is None or not all(math.isfinite(v) for v in (*ci, p_worse, p_better)):
        return "inconclusive", f"no interval could be computed (interval {ci}, p {p_worse}/{p_better})"
    low, high = ci
    # The change in the worse direction, as a fraction: > 0 is worse, whichever way the metric points.
    worse = (1.0 - high, 1.0 - low) if higher_is_better else (low - 1.0, high - 1.0)
    span = f"the 95% interval of the change, {low - 1:+.1%}..{high - 1:+.1%},"
    beyond = ("regressed" if side_of(worse, threshold) == "above" else
              "improved" if side_of(worse, -threshold) == "below" else None)
    if beyond is not None:
        p = p_worse if beyond == "regressed" else p_better
        if not p < alpha:
            return "inconclusive", f"{span} lies beyond the threshold but the test is not significant (p={p:.3g})"
        if doubts:
            return "inconclusive", f"{beyond} beyond the threshold, on timing that cannot be trusted: " + "; ".join(doubts)
        return beyond, None
    if side_of(worse, -threshold) == "above" and side_of(worse, threshold) == "below":
        return "unchanged", None
    return "inconclusive", "; ".join((f"{span} reaches the {threshold:.1%} threshold: too few or too scattered "
                                      "rounds to tell", *doubts))


def judge_bound(metric: str, bound: str, limit: float, value: float, current: list[float],
                baseline: list[float] | None, paired: bool, loads: list[dict | None]) -> tuple[bool, str | None]:
    """Whether a measured ``value`` keeps a budget's ``limit`` (``bound``: "min" or "max"): (ok, why inconclusive).

    A timed budget is judged by the gate's rule, with its limit for the threshold's edge: *ok* is a claim as "no
    change" is, so it needs the rounds' 95% interval wholly on the kept side of the limit, and a miss needs it
    wholly on the other side and no busy machine (which slows the code it times, so it voids a miss, never a pass);
    an interval that reaches the limit, or a value and an interval on different sides of it, is inconclusive.
    The same rounds thus never read "budget ok" where the gate's rule could not judge them. With fewer than
    ``MIN_ROUNDS`` rounds a side there is no interval and the value decides, as for a deterministic bound: a budget
    is checked on every run (a one-round smoke run too), where a gate, which compares two runs, calls that
    inconclusive. ``current``/``baseline``: the metric per round (``metrics.per_round``); ``baseline`` None for an
    absolute limit (``value`` is the metric, else the ratio current / baseline); ``loads``: the runs' load records.
    """
    kept = value >= limit if bound == "min" else value <= limit
    if not is_timed(metric):
        return kept, None
    doubts = [r for r in dict.fromkeys(busy_reason(load) for load in loads) if r]
    if len(current) < MIN_ROUNDS or (baseline is not None and len(baseline) < MIN_ROUNDS):
        return kept, None if kept else "; ".join(doubts) or None
    reference = [1.0] * len(current) if baseline is None else baseline
    ci = median_interval(current, reference, paired=baseline is None or (paired and len(current) == len(baseline)))
    if ci is None:
        return False, "; ".join(["no interval could be computed from the rounds", *doubts])
    side = side_of(ci, limit)
    kept_side = "above" if bound == "min" else "below"
    if side == kept_side and kept:
        return True, None
    if side is not None and side != kept_side and not kept:
        return False, "; ".join(doubts) or None
    spread = max((d for d in (dispersion(current), dispersion(baseline or [])) if d is not None), default=0.0)
    why = (f"rounds too noisy to judge: 95% interval {ci[0]:.4g}..{ci[1]:.4g} includes the limit {limit:g} "
           f"(IQR/median {spread:.0%})" if side is None else
           f"the value {value:.4g} and the rounds' 95% interval {ci[0]:.4g}..{ci[1]:.4g} lie on different sides of "
           f"the limit {limit:g}")
    return False, "; ".join([why, *doubts])
