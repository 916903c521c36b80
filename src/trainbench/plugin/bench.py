"""The callable behind the ``train_bench`` fixture: measure one case through the session's runner (or both A/B
sides), hand its synchronized rounds to pytest-benchmark, record it for the summary and the gate, and fail what its
checks fail.

This module imports torch and the core: the fixture loads it at the first trainbench case.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest

from trainbench.core.setups.eligibility import Context, why_not
from trainbench.core.setups.recipes import ConfigError
from trainbench.core.setups.spec import SpecError
from trainbench.jobs.ab import SideError, ab_thresholds, plan_case
from trainbench.plugin import benchmark_adapter
from trainbench.plugin.notices import InconclusiveTimingWarning, skip
from trainbench.verdicts.store import record_case


class TrainBench:
    """Callable behind the ``train_bench`` fixture: run one case, hand its rounds to pytest-benchmark, check it."""

    def __init__(self, benchmark, session, budgets, config, unbudgeted: Callable[[str, str | None], None]):
        self.benchmark = benchmark
        self.session = session
        self.budgets = budgets
        self.config = config
        self.unbudgeted = unbudgeted  # (case, why no budget applies): said at the end of the test file

    def _thresholds_of(self, case: str) -> dict:
        """The case's comparison thresholds from its budgets file, for this device."""
        return self.budgets.compare_thresholds(self.session.machine.runner.caps, case)

    def _inconclusive_comparisons(self):
        return self.session.gate.inconclusive_comparisons(self.config, self.benchmark.fullname, self._thresholds_of)

    def __call__(self, recipe, spec, baseline=None, **overrides):
        """Measure ``recipe`` (a name or a ``Recipe``) on ``spec`` (a ``TrainingSpec`` or a built-in workload's name)
        against ``baseline`` (default: the recipe's own); ``overrides`` set config knobs (e.g. ``batch_size=8``)."""
        simulated = self.session.options.simulate_gpu is not None
        if not simulated:
            self._refuse_parallel_timing()
        if self.session.ab is not None:
            return self._ab(recipe, spec, overrides)
        try:
            if simulated:
                plan = self.session.machine.runner.planner.plan(recipe, spec, baseline=baseline, budgets=self.budgets,
                                                        overrides=overrides)
                return self._simulated(plan, plan.case)
            outcome = self.session.machine.runner.run(recipe, spec, baseline=baseline, budgets=self.budgets, overrides=overrides,
                                              inconclusive_comparisons=self._inconclusive_comparisons())
        except (ConfigError, SpecError) as e:  # an override that cancels the recipe, a spec that cannot be trained
            # from None: the error is said once (pytest printed it twice, "During handling of the above exception")
            benchmark_adapter.mark_untimed(self.benchmark, "failed before measuring")
            raise pytest.fail.Exception(f"trainbench: {e}", pytrace=False) from None
        return self._finish(outcome)

    def case(self, case, **overrides):
        """Measure a ``trainbench.core.setups.cases.Case``: a recipe on a workload, or a ladder rung."""
        if self.session.options.simulate_gpu is not None:
            return self._simulated(self.session.machine.runner.plan_case(case, self.budgets, **overrides), case.id)
        self._refuse_parallel_timing()
        if self.session.ab is not None:
            skipped = why_not(case, self.session.machine.runner.caps, self.session.machine.runner.profile, context=Context(ab=True))
            if skipped:  # e.g. a ladder rung, which A/B runs leave to its recipe's own case
                skip(skipped)
            return self._ab(case.recipe_name, case.workload, overrides)
        return self._finish(self.session.machine.runner.run_case(case, self.budgets, self._inconclusive_comparisons(), **overrides))

    def _simulated(self, plan, case_id: str):
        """Under --trainbench-simulate-gpu: skip the case as that GPU would, or with what it would do there; fail it
        where the night would crash on it (``Machine.simulated_outcome``)."""
        action, why = self.session.machine.simulated_outcome(plan, case_id)
        if action == "fail":
            benchmark_adapter.mark_untimed(self.benchmark, "failed before measuring")
            pytest.fail(f"trainbench: {why}", pytrace=False)
        skip(why)

    def _ab(self, recipe, spec, overrides: dict):
        """Measure the case in both environments, rounds alternating, and compare them (``trainbench.jobs.ab``)."""
        options, runner = self.session.options, self.session.machine.runner
        try:
            plan = plan_case(recipe, spec, overrides, runner, options.rootpath)
        except (ConfigError, SpecError) as e:
            benchmark_adapter.mark_untimed(self.benchmark, "failed before measuring")
            raise pytest.fail.Exception(f"trainbench: {e}", pytrace=False) from None
        if plan.skipped:
            skip(plan.skipped)
        case = plan.case.case
        thresholds = ab_thresholds(options.compare_fail, self.budgets.compare_thresholds(runner.caps, case))
        try:
            outcome = self.session.ab.run(plan.case, thresholds, loss_rtol=plan.loss_rtol,
                                          head_slowdown=options.fault.slowdown if options.fault else 0.0)
        except SideError as e:
            benchmark_adapter.mark_untimed(self.benchmark, "failed before measuring")
            raise pytest.fail.Exception(f"trainbench A/B: {e}", pytrace=False) from None
        benchmark_adapter.replay_rounds(self.benchmark, [head for _, head in outcome.pairs], outcome.head.steps_per_round)
        record_case(self.benchmark, {"case": case, "ab": {
            "pairs": outcome.pairs, "comparisons": [c.describe() for c in outcome.comparisons],
            "guard": outcome.guard.message if outcome.guard else None}})
        # A regression fails the case; a verdict that stayed inconclusive fails the session ("could not judge",
        # its own exit status) at its end, with the reason in the summary.
        regressed = [c.describe() for c in outcome.comparisons if c.fails(allow_inconclusive=True)]
        if regressed and options.compare_fail is not None:
            pytest.fail("trainbench A/B: head regressed:\n" + "\n".join(regressed), pytrace=False)
        return outcome.head

    def _refuse_parallel_timing(self) -> None:
        """Under pytest-xdist workers sharing the device, a timed case is refused; with --benchmark-disable the
        case runs untimed (its deterministic budgets are judged, its timed ones are not)."""
        reason = self.session.machine.parallel_timing_reason()
        if reason is None:
            return
        if not self.session.options.benchmark_disabled:
            benchmark_adapter.mark_untimed(self.benchmark, "refused")
            pytest.fail(f"trainbench: timed case refused: {reason}. Run it without -n (or with one worker per GPU), "
                        "or add --benchmark-disable to check only its deterministic signals in parallel",
                        pytrace=False)
        self.session.machine.runner.untimed = f"untimed run: {reason} (--benchmark-disable)"

    def _finish(self, outcome):
        if outcome.skipped:
            skip(outcome.skipped)
        if outcome.error is not None:  # no result to time or store: listed in the summary and the saved run
            self.session.recorded.record(outcome, self.benchmark.fullname, self._thresholds_of)
            benchmark_adapter.mark_untimed(self.benchmark, "failed before measuring")
            pytest.fail(f"trainbench: {outcome.error}", pytrace=False)
        benchmark_adapter.replay_rounds(self.benchmark, outcome.result.round_step_times_s, outcome.result.steps_per_round)
        record_case(self.benchmark, self.session.recorded.record(outcome, self.benchmark.fullname, self._thresholds_of))
        self._forecast(outcome)
        for line in outcome.inconclusive:
            warnings.warn(InconclusiveTimingWarning(line), stacklevel=3)
        if outcome.budget is None and not (self.session.options.require_budgets or outcome.budget_required):
            self.unbudgeted(outcome.case, outcome.budget_missing)
        if outcome.failures:
            pytest.fail("trainbench checks failed:\n" + "\n".join(outcome.failures), pytrace=False)
        return outcome.result

    def _forecast(self, outcome) -> None:
        """After the first measured case of a long session, what the rest will cost at its pace."""
        line = self.session.recorded.forecast(outcome, self.session.collected)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if line and reporter is not None:
            reporter.write_line("")
            reporter.write_line(line, yellow=True)
