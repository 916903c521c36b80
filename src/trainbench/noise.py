"""Can a timed check be judged? The rounds' dispersion, the interval of a ratio, and a busy machine.

A speed budget or a timing gate that fails on a machine that other processes loaded, or on
rounds too scattered to place the value on one side of its limit, says nothing about the
code. This module answers one question for both (``inconclusive_reason``): why a timed
verdict cannot be trusted, or None. Deterministic signals (memory breakdown, FLOPs, bytes,
ops, syncs) never come here: load cannot move them.
"""

from __future__ import annotations

import statistics

from .metrics import is_timed

# Other processes used at least this share of our cores, on average, while a case ran: its rounds
# were contended (a 2-process CPU hog on 2 cores shows as ~1 CPU; a quiet runner as < 0.1).
BUSY_SHARE = 0.25
CONFIDENCE = 0.95


def dispersion(values: list[float]) -> float | None:
    """Inter-quartile range / median of the rounds (None: fewer than 2)."""
    if len(values) < 2:
        return None
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / median if median else None


def median_ratio_interval(current: list[float], baseline: list[float], paired: bool) -> tuple[float, float]:
    """95% bootstrap interval of the median ratio current / baseline.

    ``paired``: round i of each side ran next to each other (ABBA), so the ratio is taken per pair and a
    slow spell cancels in it; otherwise the ratio of the two sides' medians, resampled independently.
    """
    import numpy as np
    from scipy import stats

    rng = np.random.default_rng(0)  # the same rounds give the same interval
    if paired:
        ratios = np.asarray(current) / np.asarray(baseline)
        boot = stats.bootstrap((ratios,), np.median, vectorized=True, n_resamples=2000, method="percentile", rng=rng)
    else:
        def ratio(c, b, axis=-1):
            return np.median(c, axis=axis) / np.median(b, axis=axis)

        boot = stats.bootstrap((np.asarray(current), np.asarray(baseline)), ratio, vectorized=True, paired=False,
                               n_resamples=2000, method="percentile", rng=rng)
    return float(boot.confidence_interval.low), float(boot.confidence_interval.high)


def busy_reason(load: dict | None) -> str | None:
    """Why the machine was too busy to time on, from a ``host.LoadMeter`` record, or None."""
    if not load or load.get("other_cpus") is None or not load.get("cpus"):
        return None
    if load["other_cpus"] < BUSY_SHARE * load["cpus"]:
        return None
    average = load.get("load_average_1m")
    return (f"busy machine: other processes used {load['other_cpus']:.2f} of {load['cpus']} CPUs while it ran"
            + (f", load average {average[0]:.2f} -> {average[1]:.2f}" if average else ""))


def inconclusive_reason(metric: str, limit: float, value: float, current: list[float], baseline: list[float] | None,
                        paired: bool, loads: list[dict | None]) -> str | None:
    """Why a timed value on the wrong side of ``limit`` does not show that it is there, or None (it does).

    ``current``/``baseline``: the metric per round (``metrics.per_round``); ``baseline`` None for an absolute limit
    (then ``value`` is the metric, else the ratio current / baseline). ``loads``: the ``LoadMeter`` records
    of the runs involved. Inconclusive when the 95% interval of the value (or ratio) reaches the limit,
    or another process loaded the machine.
    """
    if not is_timed(metric):
        return None
    reasons = []
    if len(current) >= 3 and (baseline is None or len(baseline) >= 3):
        if baseline is None:
            low, high = median_ratio_interval(current, [1.0] * len(current), paired=True)
        else:
            low, high = median_ratio_interval(current, baseline, paired and len(current) == len(baseline))
        if low <= limit <= high:
            spread = max(d for d in (dispersion(current), dispersion(baseline or [])) if d is not None)
            reasons.append(f"rounds too noisy to judge: 95% interval {low:.4g}..{high:.4g} includes the limit "
                           f"{limit:g} (IQR/median {spread:.0%})")
    reasons += [r for r in dict.fromkeys(busy_reason(load) for load in loads) if r]
    return "; ".join(reasons) or None
