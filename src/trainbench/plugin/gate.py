"""The session's verdict: every case compared with the baseline run (or the A/B sides) at its end, a gated
regression or a gate that compared nothing failing it, and the session's exit status once the verdict has set it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from trainbench.core.harness.files import write_json_atomic
from trainbench.core.records.result import CaseRecord, RecordError
from trainbench.plugin import benchmark_adapter
from trainbench.plugin.options import Options
from trainbench.verdicts.gate import Verdict
from trainbench.verdicts.present import last_line
from trainbench.verdicts.store import SavedRun, packages_of


def _compare():
    """The comparison of runs: loaded by a session that compares (~40 ms of every other session's start)."""
    from trainbench.verdicts import compare  # lazy: see above

    return compare


@dataclass
class Gate:
    options: Options
    comparison: Verdict | None = None  # filled at the session's end when compared (or A/B ran)
    exit_status: int | None = None  # the session's, once the verdict (or an unsaved run) has set it

    def inconclusive_comparisons(self, config, fullname: str, thresholds_of: Callable[[str], dict]):
        """Under a gate, why a case's timed comparisons with its baseline record cannot be judged yet
        (``compare.inconclusive_comparisons``, for the runner to measure it again), or None where nothing compares
        it. ``thresholds_of(case)``: its budgets' comparison thresholds."""
        baseline = benchmark_adapter.loaded_baseline(config)
        if not baseline or self.options.compare_fail is None:
            return None
        try:
            base = SavedRun.compared(*baseline).case(fullname)
        except RecordError:
            return None  # the gate names the broken record at the end
        if base is None:
            return None

        def unsure(outcome) -> list[str]:
            limits = _compare().case_thresholds(self.options.compare_fail, thresholds_of(outcome.case))
            current = CaseRecord.read(outcome.record(), outcome.case)
            return _compare().inconclusive_comparisons(current, base, limits, self.options.compare_alpha)

        return unsure

    def verdict(self, config, cases: list, collected: int, ab, identity: Callable[[], dict],
                packages: Callable[[], dict]) -> Verdict | None:
        """The comparison's verdict (None: none asked for, or a plain pytest-benchmark session's): the A/B sides', or
        the measured ``cases`` against the run pytest-benchmark loaded (this device's ``identity()``, this
        process's installed ``packages()``)."""
        o = self.options
        gated = o.compare_fail is not None
        if not (gated or collected):
            return None  # no trainbench case and no gate: pytest-benchmark's own comparison, as without trainbench
        if ab is not None:
            verdict = ab.verdict(gated=gated, allow_inconclusive=o.allow_inconclusive)
            measured = len(ab.outcomes)
        else:
            baseline = benchmark_adapter.loaded_baseline(config)
            if baseline is None:
                return None
            verdict = _compare().compare_with_baseline(cases, baseline[1], baseline[0], identity(), o.compare_fail,
                                            o.compare_alpha, allow_new_cases=o.allow_new_cases,
                                            allow_inconclusive=o.allow_inconclusive,
                                            packages=(packages_of(baseline[0]), packages()))
            measured = len(cases)
        if verdict.comparisons or verdict.errors:
            return verdict
        why = ("no trainbench case ran (each was skipped or deselected)" if not measured else
               f"no metric of the {measured} case(s) measured could be compared"
               + (f" ({len(verdict.new_cases)} not in the baseline run)" if verdict.new_cases else ""))
        return dataclasses.replace(verdict, nothing_compared=why)

    def conclude(self, session, verdict: Verdict | None, stopped: pytest.ExitCode | None, ab: bool) -> None:
        """Keep the verdict, write it (--trainbench-compare-json), and fail the session on a failed one; ``stopped``:
        the status an unsaved run or a late SIGTERM gives the session (None: neither). A failed test's status
        stands."""
        self.comparison = verdict
        if verdict is not None:
            if self.options.compare_json is not None:
                write_json_atomic(self.options.compare_json, verdict.to_json())
            if verdict.failed and not session.exitstatus:
                session.exitstatus = verdict.exit_status
        if stopped is not None and not session.exitstatus:
            session.exitstatus = stopped
        if verdict is not None or stopped is not None:
            self.exit_status = int(session.exitstatus)
        if verdict is not None and verdict.failed and self.options.xdist_workers == 1:
            self._report_failed(session, ab)  # an xdist worker's report is not its to add

    def _report_failed(self, session, ab: bool) -> None:
        """A failed gate is a failure in pytest's own summary too ("FAILED trainbench gate - ...", "3 passed, 1
        failed" in red, a failed test case in --junitxml): pytest's closing line alone read green."""
        line = last_line(self.comparison.to_json(), self.exit_status)
        what = "A/B" if ab else "gate"
        report = pytest.TestReport(f"trainbench {what}", ("trainbench", None, f"trainbench {what}"), {}, "failed",
                                   line, "call")
        session.config.hook.pytest_runtest_logreport(report=report)
