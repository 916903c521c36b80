"""The suite for asv: every case of ``trainbench.core.setups.cases`` measured once per environment, by the same runner as pytest.

``benchmarks/asv_bench.py`` calls ``measure_all`` from asv's ``setup_cache`` (run once per
environment and commit); each ``track_*`` then reads its number from the cache. Cases
are the pytest suite's, by the same ids, and ``trainbench.core.method.runner`` runs them with the same
budgets file, so asv gets the same interleaved ratios and correctness guards.
"""

from __future__ import annotations

import re
from pathlib import Path

from trainbench.core.method.measure import DEFAULT_SETTINGS, with_overrides
from trainbench.core.method.runner import Runner
from trainbench.core.records.budgets import Budgets
from trainbench.core.setups.cases import Case, all_cases
from trainbench.core.setups.eligibility import Context, why_not
from trainbench.core.setups.workloads import PROFILES
from trainbench.devices.device import get_backend
from trainbench.devices.host import ASV_TIMEOUT_S, env_switch, env_value

# Environment knobs for asv runs (asv passes no arguments to benchmarks), read as host.ENVIRONMENT says:
CASES_ENV = "TRAINBENCH_ASV_CASES"  # regex: measure only matching case ids (e.g. a quick CI pass)
SLOW_ENV = "TRAINBENCH_ASV_SLOW"  # "1": also the slow cases (torch.compile)
DEVICE_ENV = "TRAINBENCH_ASV_DEVICE"  # auto | cpu | cuda | cuda:N
TIMEOUT_ENV = "TRAINBENCH_ASV_TIMEOUT"  # seconds for the one setup_cache that measures every case
DEFAULT_TIMEOUT_S = ASV_TIMEOUT_S


def cache_timeout_s() -> float:
    """How long asv lets the whole suite's measurement run: $TRAINBENCH_ASV_TIMEOUT seconds, else two hours. A value
    that is no positive number of seconds is refused in one line (``host.EnvError``)."""
    return env_value(TIMEOUT_ENV)


def case_ids() -> list[str]:
    """The asv parameter list: every case id, or those matching $TRAINBENCH_ASV_CASES when it is set. Every asv
    variable is read here, as the suite loads: one that cannot be used stops it then, in one line."""
    env_switch(SLOW_ENV)
    env_value(DEVICE_ENV)
    pattern = env_value(CASES_ENV)
    return [case.id for case in all_cases() if not pattern or re.search(pattern, case.id)]


def _not_taken(case: Case, runner, selected: re.Pattern | None, pattern: str | None) -> str | None:
    """Why this run leaves ``case`` out: it cannot run here (the device, a slow case), or it is not selected."""
    asv_run = Context(slow_allowed=env_switch(SLOW_ENV), slow_hint=f"set {SLOW_ENV}=1")
    reason = why_not(case, runner.caps, runner.profile, context=asv_run)
    if reason:
        return f"{case.id}: {reason}"
    if selected is not None and not selected.search(case.id):
        return f"{case.id}: not selected by {CASES_ENV}={pattern!r}"
    return None


def measure_all(pattern: str | None = None, budgets_path: Path | str | None = None) -> dict[str, dict]:
    """Every case id -> {"record": the case's record (``CaseOutcome.record``)}, {"skip": reason} or {"error": why it
    failed}.

    ``pattern`` defaults to $TRAINBENCH_ASV_CASES; ``budgets_path`` (the suite's budgets file)
    decides, as in pytest, which cases are timed interleaved with their baseline.
    """
    pattern = pattern if pattern is not None else env_value(CASES_ENV)
    backend = get_backend(env_value(DEVICE_ENV))
    profile = PROFILES[backend.profile_name]
    budgets = Budgets.load(budgets_path) if budgets_path else Budgets.empty()
    selected = re.compile(pattern) if pattern else None
    results, burned_in = {}, False
    # asv keeps the numbers only: no attribution tables (where a change comes from is the gate's and explain's)
    runner = Runner(backend, profile, with_overrides(DEFAULT_SETTINGS[profile.name], attribution=False), predict=True)
    for case in all_cases():
        reason = _not_taken(case, runner, selected, pattern)
        if reason:
            results[case.id] = {"skip": reason}
            continue
        outcome = runner.run_case(case, budgets)
        if not burned_in and not outcome.skipped:
            # The first case after a process starts runs up to 4x slower on a shared runner (measured:
            # resnet18-baseline at 41 samples/s first, 178 later): measure it again and keep the second.
            outcome = runner.run_case(case, budgets)
            burned_in = True
        if outcome.skipped:
            results[case.id] = {"skip": f"{case.id}: {outcome.skipped}"}
            continue
        if outcome.error is not None:  # out of memory, a hung loader: its tracks fail with the reason
            results[case.id] = {"error": outcome.error}
            continue
        results[case.id] = {"record": outcome.record()}  # the case's one serialized form, as pytest saves it
    return results
