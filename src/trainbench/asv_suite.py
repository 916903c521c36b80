"""The suite for asv: every case of ``trainbench.cases`` measured once per environment.

``benchmarks/asv_bench.py`` calls ``measure_all`` from asv's ``setup_cache`` (run once per
environment and commit); each ``track_*`` then reads its number from the cache. Cases
are the pytest suite's, by the same ids, so adding a recipe to the suite adds it here.
"""

from __future__ import annotations

import os
import re

from .cases import Case, all_cases

# Environment knobs for asv runs (asv passes no arguments to benchmarks):
CASES_ENV = "TRAINBENCH_ASV_CASES"  # regex: measure only matching case ids (e.g. a quick CI pass)
SLOW_ENV = "TRAINBENCH_ASV_SLOW"  # "1": also the slow cases (torch.compile)
DEVICE_ENV = "TRAINBENCH_ASV_DEVICE"  # auto | cpu | cuda | cuda:N


def case_ids() -> list[str]:
    """The asv parameter list: every case id, or those matching $TRAINBENCH_ASV_CASES when it is set."""
    pattern = os.environ.get(CASES_ENV)
    return [case.id for case in all_cases() if not pattern or re.search(pattern, case.id)]


def skip_reason(case: Case, backend, profile) -> str | None:
    """Why this device or run does not take ``case`` (GPU-only, several GPUs, slow), or None."""
    own = case.own_recipe()
    reason = own.unmet(backend, profile)
    if reason is None and own.slow and os.environ.get(SLOW_ENV) != "1":
        reason = f"slow case: set {SLOW_ENV}=1"
    return f"{case.id}: {reason}" if reason else None


def measure_case(case: Case, backend, profile) -> dict:
    """{"metrics": {...}} of one case, measured as the pytest plugin does (without its budgets)."""
    from .measure import measure

    result = measure(case.recipe(backend, profile), backend, profile, workload=case.workload, case=case.id)
    return {"metrics": result.metrics(), "device": result.device}


def measure_all(pattern: str | None = None) -> dict[str, dict]:
    """Every case id -> its measurement or skip reason (``pattern`` defaults to $TRAINBENCH_ASV_CASES)."""
    from .device import get_backend
    from .workloads import profile_for

    pattern = pattern if pattern is not None else os.environ.get(CASES_ENV)
    backend = get_backend(os.environ.get(DEVICE_ENV, "auto"))
    profile = profile_for(backend.kind)
    selected = re.compile(pattern) if pattern else None
    results, burned_in = {}, False
    for case in all_cases():
        reason = skip_reason(case, backend, profile)
        if reason is None and selected is not None and not selected.search(case.id):
            reason = f"{case.id}: not selected by {CASES_ENV}={pattern!r}"
        if reason:
            results[case.id] = {"skip": reason}
            continue
        if not burned_in:
            # The first case after a process starts runs up to 4x slower on a shared runner (measured:
            # resnet18-baseline at 41 samples/s first, 178 later): measure it once and throw that away.
            measure_case(case, backend, profile)
            burned_in = True
        results[case.id] = measure_case(case, backend, profile)
    return results
