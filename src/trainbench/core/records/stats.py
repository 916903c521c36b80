"""Can timing be judged? The one place that reads rounds statistically: intervals, tests, a busy machine, verdicts.

Every timed verdict asks this module: the gate (``compare``, rounds of two runs), A/B (``ab``, pairs), a timed
budget (``judge``, rounds against a limit) and the attribution of a change (``explain``, profiled steps). It owns

- the one interval of a change (``change_interval``: a ratio or a difference, paired, unpaired or against a
  limit), exact at every round count, the rounds it needs (``rounds_needed``, ``too_few_rounds``) and the change
  it is centred on (``median_change``);
- the share of the error each look at a case's rounds may spend when it is measured again (``look_alpha``);
- the one-sided tests behind a gate's or A/B's direction (``rank_tests``, ``signed_rank_tests``);
- whether an interval shows a change at all (``beyond_noise``);
- the busy-machine doubt (``busy_reason``), which no interval answers: a loaded machine slows its code;
- the judgement of a change against a threshold (``judge_change``) and of a value against a budget's limit
  (``judge_bound``), by one rule: a verdict either way is a claim, made only where the interval lies wholly on
  its side (``side_of``); an interval that reaches the edge is *inconclusive*, with the reason.

Deterministic signals (memory breakdown, FLOPs, bytes, ops, syncs) never come here: load cannot move them.
"""

from __future__ import annotations

import bisect
import functools
import math
import statistics

from trainbench.core.records.metrics import is_timed

# Other processes used at least this share of our cores, on average, while a case ran: its rounds
# were contended (a 2-process CPU hog on 2 cores shows as ~1 CPU; a quiet runner as < 0.1).
BUSY_SHARE = 0.25
CONFIDENCE = 0.95
ALPHA_SIDE = (1 - CONFIDENCE) / 2  # a verdict either way is a claim: each side may err this often
MAX_LOOKS = 5  # a case measured five times that still cannot be judged will not be by a sixth
# An A/B case inconclusive at its pairs takes as many again, up to this many times its pairs (its planned looks)
MAX_PAIRS_FACTOR = 8


def dispersion(values: list[float]) -> float | None:
    """Inter-quartile range / median of the rounds (None: fewer than 2)."""
    if len(values) < 2:
        return None
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / median if median else None


def median_change(current: list[float], baseline: list[float], paired: bool, relative: bool = True) -> float:
    """The change ``change_interval`` is the interval of: current / baseline (``relative``) or current - baseline,
    taken per pair and their median (``paired``: item i of each side ran next to each other), else of the medians."""
    def of(c, b):
        return c / b if relative else c - b

    if paired:
        return statistics.median(of(c, b) for c, b in zip(current, baseline))
    return of(statistics.median(current), statistics.median(baseline))


def _numpy():
    """numpy, for the intervals and the rank tests' null distributions."""
    import numpy  # lazy: ~0.1 s, which the plugin's import in every pytest session of a user's project need not pay

    return numpy


def _scipy_stats():
    """``scipy.stats``, for the sign interval and the rank tests alone."""
    from scipy import stats  # lazy: about a second to import, which reading and comparing saved runs need not pay

    return stats


@functools.lru_cache(maxsize=None)
def _signed_rank_cdf(n: int) -> tuple[float, ...]:
    """P(W <= w), w = 0..n(n+1)/2, for the Wilcoxon signed-rank statistic of n pairs under no change: the
    generating function prod(1 + x^i) over the ranks i = 1..n, over its 2^n equally likely sign patterns."""
    np = _numpy()
    counts = np.ones(1, dtype=float)
    for i in range(1, n + 1):
        counts = np.concatenate([counts, np.zeros(i)]) + np.concatenate([np.zeros(i), counts])
    return tuple(np.cumsum(counts) / counts.sum())


@functools.lru_cache(maxsize=None)
def _rank_sum_cdf(n: int, m: int) -> tuple[float, ...]:
    """P(U <= u), u = 0..n*m, for the Mann-Whitney statistic of n against m values under no change (the
    Gaussian binomial coefficient's counts, built one value at a time: U(n, m) = U(n-1, m) + m or U(n, m-1))."""
    np = _numpy()
    # table[j]: counts of U for (i values, j values), i growing row by row
    table = [np.ones(1, dtype=float) for _ in range(m + 1)]
    for _ in range(1, n + 1):
        row = [np.ones(1, dtype=float)]
        for j in range(1, m + 1):
            shifted = np.concatenate([np.zeros(j), table[j]])
            left = row[j - 1]
            size = max(len(shifted), len(left))
            row.append(np.pad(shifted, (0, size - len(shifted))) + np.pad(left, (0, size - len(left))))
        table = row
    counts = table[m]
    return tuple(np.cumsum(counts) / counts.sum())


def _order_rank(cdf: tuple[float, ...], alpha_side: float) -> int:
    """The 1-based rank k of the interval's lower end ([k-th smallest, k-th largest]): the largest k whose
    statistic's P(stat <= k - 1) <= ``alpha_side`` under no change (0: no interval reaches that level)."""
    return bisect.bisect_right(cdf, alpha_side * (1 + 1e-12))


def _most_extreme(kind: str, n: int, m: int | None = None) -> float:
    """The chance under no change of the exact test's most extreme outcome for ``n`` rounds (against ``m`` for
    "unpaired"): no interval at a smaller error a side exists, however the rounds fall."""
    if kind == "unpaired":
        return _rank_sum_cdf(n, m)[0] if n and m else 1.0
    return _signed_rank_cdf(n)[0] if kind == "paired" else 0.5 ** n


def rounds_needed(design: str, alpha_side: float = ALPHA_SIDE) -> int:
    """The fewest rounds a side (pairs for "paired") from which ``change_interval`` can exclude a change at
    ``alpha_side`` a side: "paired" (signed ranks, 2^-n), "unpaired" (rank sums of n against n, 1/C(2n, n)) or
    "single" (the median of one side's rounds against a limit, sign test, 2^-n)."""
    for n in range(1, 64):
        if _most_extreme(design, n, n) <= alpha_side:
            return n
    raise ValueError(f"no round count up to 63 reaches {alpha_side}")


def least_rounds(kind: str, planned_looks: int = 1) -> int:
    """The fewest rounds (``rounds_needed``'s ``kind``) from which a case's first look can claim anything."""
    return rounds_needed(kind, look_alpha(1, planned_looks))


def change_interval(current: list[float], baseline: list[float] | None, paired: bool, relative: bool = True,
                    alpha_side: float = ALPHA_SIDE) -> tuple[float, float] | None:
    """The interval of ``median_change`` that errs at most ``alpha_side`` a side, exactly at every round count
    (None: too few rounds for that level, or values a ratio cannot take).

    Distribution-free intervals by inverting rank tests (docs/method.md, section 2b), chosen because the
    percentile bootstrap of a median claimed wrongly up to 12% a side at the round counts the suite runs:

    - ``paired`` (item i of each side ran next to each other): the Hodges-Lehmann interval of the per-pair
      changes from the Wilcoxon signed-rank test: a slow spell that falls on both sides of a pair cancels, and the
      change of a pair is symmetric about the true change when both sides have the same noise;
    - unpaired: the Hodges-Lehmann interval of the shift between the two sides from the Mann-Whitney test;
    - ``baseline`` None: the order-statistic interval of the median of ``current`` (sign test): an absolute limit.

    ``relative``: the change current / baseline, computed on logarithms (a ratio's noise is symmetric there);
    else current - baseline.
    """
    np = _numpy()
    cur = np.asarray(current, dtype=float)
    base = None if baseline is None else np.asarray(baseline, dtype=float)
    if relative:
        if (cur <= 0).any() or (base is not None and (base <= 0).any()):
            return None
        cur, base = np.log(cur), (None if base is None else np.log(base))
    if not np.isfinite(cur).all() or (base is not None and not np.isfinite(base).all()):
        return None
    if base is None:
        values = np.sort(cur)
        n = len(values)
        k = _order_rank(tuple(_scipy_stats().binom.cdf(np.arange(n + 1), n, 0.5)), alpha_side) if n else 0
    elif paired:
        if len(cur) != len(base) or not len(cur):
            return None
        d = cur - base
        values = np.sort((d[:, None] + d[None, :])[np.triu_indices(len(d))] / 2)  # Walsh averages
        k = _order_rank(_signed_rank_cdf(len(d)), alpha_side)
    else:
        if not len(cur) or not len(base):
            return None
        values = np.sort((cur[:, None] - base[None, :]).ravel())
        k = _order_rank(_rank_sum_cdf(len(cur), len(base)), alpha_side)
    if k == 0:
        return None
    low, high = float(values[k - 1]), float(values[len(values) - k])
    return (math.exp(low), math.exp(high)) if relative else (low, high)


def planned_looks(remeasure_inconclusive: int, remeasure_s: float, gated: bool) -> int:
    """How many looks at its rounds a case may get (``judge.Judge``): its first measurement, the re-measurements a
    budget gets, and, under a gate with time to re-measure, up to ``MAX_LOOKS`` in all (the error is shared out
    over these before the first: ``look_alpha``)."""
    again = max(remeasure_inconclusive, MAX_LOOKS - 1 if gated and remeasure_s > 0 else 0)
    return 1 + min(max(again, 0), MAX_LOOKS - 1)


def look_alpha(look: int, planned_looks: int) -> float:
    """The error a side that look ``look`` (1-based) of ``planned_looks`` may spend: half of what is left at each
    look before the last, the rest at the last (alpha/2, alpha/4, ..., and alpha/2^(K-1) at look K), so that over
    every look a case can get the claims err at most ``ALPHA_SIDE`` a side whatever the rounds show (the union of
    the looks' errors bounds it). A case judged once spends it all at once."""
    if planned_looks <= 1:
        return ALPHA_SIDE
    look = min(max(look, 1), planned_looks)
    return ALPHA_SIDE * 0.5 ** min(look, planned_looks - 1)


def rank_tests(current: list[float], baseline: list[float], higher_is_better: bool) -> tuple[float, float]:
    """One-sided Mann-Whitney p-values that the current rounds are worse, and better, than the baseline's."""
    stats = _scipy_stats()
    worse_side, better_side = ("less", "greater") if higher_is_better else ("greater", "less")
    return (float(stats.mannwhitneyu(current, baseline, alternative=worse_side).pvalue),
            float(stats.mannwhitneyu(current, baseline, alternative=better_side).pvalue))


def signed_rank_tests(ratios: list[float], higher_is_better: bool) -> tuple[float, float]:
    """One-sided Wilcoxon signed-rank p-values that the pairs' ratios (current / baseline) lean worse, and better
    (the test the paired ``change_interval`` inverts; every pair unchanged: 1.0 both ways)."""
    np = _numpy()
    logs = np.log(np.asarray(ratios, dtype=float))
    if not np.any(logs):
        return 1.0, 1.0
    stats = _scipy_stats()
    worse_side, better_side = ("less", "greater") if higher_is_better else ("greater", "less")
    return (float(stats.wilcoxon(logs, alternative=worse_side).pvalue),
            float(stats.wilcoxon(logs, alternative=better_side).pvalue))


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


def level(alpha_side: float) -> str:
    """An interval's confidence as the reports say it: "95%" at ``ALPHA_SIDE``, "97.5%" at a later look's half."""
    return f"{(1 - 2 * alpha_side) * 100:.4g}%"


def design(current: list[float], baseline: list[float] | None, paired: bool) -> str:
    """How rounds are read against each other (``rounds_needed``): "single" (no baseline: an absolute limit),
    "paired" (interleaved with the baseline, as many rounds a side) or "unpaired"."""
    return "single" if baseline is None else "paired" if paired and len(current) == len(baseline) else "unpaired"


def too_few_rounds(current: list[float], baseline: list[float] | None, paired: bool,
                   alpha_side: float = ALPHA_SIDE) -> str | None:
    """Why these rounds cannot give an interval at ``alpha_side`` a side however they fall, or None: the exact
    test's most extreme outcome is itself more likely than ``alpha_side`` under no change."""
    kind = design(current, baseline, paired)
    n = len(current)
    if _most_extreme(kind, n, len(baseline or [])) <= alpha_side:
        return None
    counted = {"paired": "pairs of rounds", "unpaired": "rounds a side", "single": "rounds"}[kind]
    have = min(n, len(baseline)) if kind == "unpaired" else n
    return (f"{have} {counted} cannot place a change at {level(alpha_side)} however they fall: at least "
            f"{rounds_needed(kind, alpha_side)} are needed (--trainbench-rounds)")


def judge_change(ci: tuple[float, float] | None, p_worse: float, p_better: float, threshold: float,
                 higher_is_better: bool, alpha: float, doubts: tuple[str, ...] = (),
                 alpha_side: float = ALPHA_SIDE) -> tuple[str, str | None]:
    """The one rule for a timed change read over rounds (the gate) or pairs (A/B): (verdict, why inconclusive).

    ``ci``: the interval of current / baseline (``change_interval`` at ``alpha_side``, the look's share of the
    error); ``p_worse``/``p_better``: one-sided tests that current is
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
    span = f"the {level(alpha_side)} interval of the change, {low - 1:+.1%}..{high - 1:+.1%},"
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
                baseline: list[float] | None, paired: bool, loads: list[dict | None],
                alpha_side: float = ALPHA_SIDE) -> tuple[bool, str | None]:
    """Whether a measured ``value`` keeps a budget's ``limit`` (``bound``: "min" or "max"): (ok, why inconclusive).

    A timed budget is judged by the gate's rule, with its limit for the threshold's edge: *ok* is a claim as "no
    change" is, so it needs the rounds' interval (``change_interval`` at ``alpha_side``, the look's share of the
    error) wholly on the kept side of the limit, and a miss needs it
    wholly on the other side and no busy machine (which slows the code it times, so it voids a miss, never a pass);
    an interval that reaches the limit, or a value and an interval on different sides of it, is inconclusive, and
    so is a case with fewer rounds than any interval at that level needs (``too_few_rounds``: a one-round smoke
    run's timed budgets are not judged). ``current``/``baseline``: the metric per round (``metrics.per_round``);
    ``baseline`` None for an absolute limit (``value`` is the metric, else the ratio current / baseline);
    ``loads``: the runs' load records.
    """
    kept = value >= limit if bound == "min" else value <= limit
    if not is_timed(metric):
        return kept, None
    doubts = [r for r in dict.fromkeys(busy_reason(load) for load in loads) if r]
    few = too_few_rounds(current, baseline, paired, alpha_side)
    if few:
        return False, "; ".join([few, *doubts])
    ci = change_interval(current, baseline, paired=design(current, baseline, paired) == "paired", alpha_side=alpha_side)
    if ci is None:
        return False, "; ".join(["no interval could be computed from the rounds", *doubts])
    side = side_of(ci, limit)
    kept_side = "above" if bound == "min" else "below"
    if side == kept_side and kept:
        return True, None
    if side is not None and side != kept_side and not kept:
        return False, "; ".join(doubts) or None
    spread = max((d for d in (dispersion(current), dispersion(baseline or [])) if d is not None), default=0.0)
    name = f"{level(alpha_side)} interval"
    why = (f"rounds too noisy to judge: {name} {ci[0]:.4g}..{ci[1]:.4g} includes the limit {limit:g} "
           f"(IQR/median {spread:.0%})" if side is None else
           f"the value {value:.4g} and the rounds' {name} {ci[0]:.4g}..{ci[1]:.4g} lie on different sides of "
           f"the limit {limit:g}")
    return False, "; ".join([why, *doubts])
