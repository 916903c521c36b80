"""What running a case gave: its result, its baseline, the checks and their failures (``CaseOutcome``), and
the case's one serialized form (``CaseOutcome.record``).

A ``CaseOutcome`` is a value: each step of a case (execute, judge, trace) returns a new one
(``dataclasses.replace``), so no step changes what another step or the session already holds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainbench.core.records.budgets import BoundCheck, CaseBudget
from trainbench.core.records.result import Result, budget_status, case_id, case_record
from trainbench.core.records.stats import busy_reason

__all__ = ["CaseOutcome", "GuardCheck", "case_id", "failed_without_result"]  # case_id: the records' own, named here too


@dataclass(frozen=True)
class GuardCheck:
    """One correctness guard's check of a recipe against its baseline (``trainbench.core.setups.guards``)."""

    ok: bool
    kind: str  # "loss" | "gradients"
    max_rel_diff: float
    message: str
    losses: list[float] | None = None
    baseline_losses: list[float] | None = None


@dataclass(frozen=True)
class CaseOutcome:
    """What running a case gave: its result, its baseline, the checks and their failures."""

    case: str
    recipe: object  # a trainbench.core.setups.recipes.Recipe (records import no setups: they stay torch-free)
    result: Result | None = None
    skipped: str | None = None
    baseline_recipe: object | None = None  # a Recipe, as recipe
    baseline: Result | None = None
    paired: bool = False  # the baseline's rounds were interleaved with the case's
    budget: CaseBudget | None = None
    budget_missing: str | None = None  # why no budget applies ("no budgets file ...", "no section ...")
    budget_required: bool = False  # a missing budget fails the case (--trainbench-require-budgets)
    bound_checks: tuple[BoundCheck, ...] = ()
    guard_checks: tuple[GuardCheck, ...] = ()
    failures: tuple[str, ...] = ()
    ladder: dict | None = None
    error: str | None = None  # the case failed before it had a result (out of memory)
    fresh_losses: tuple[list[float], list[float]] | None = None  # the loss guard's inputs, run in the fresh processes
    trace: dict | None = None  # a profile trace asked for: {"files": [...]}, {"skipped": why} or {"error": why not written}

    def failing(self, *lines: str) -> CaseOutcome:
        """This outcome with ``lines`` added to its failures."""
        return replace(self, failures=(*self.failures, *lines)) if lines else self

    @property
    def speedup(self) -> float | None:
        if self.baseline is None or not self.baseline.samples_per_s or not self.result or not self.result.samples_per_s:
            return None
        return self.result.samples_per_s / self.baseline.samples_per_s

    @property
    def speedup_doubt(self) -> str | None:
        """Why ``speedup`` is no finding, or None: a busy machine while the case's rounds or its baseline's ran
        (``stats.busy_reason``), which slows whatever it times. Interleaved rounds share the load; an unpaired
        baseline timed at another moment carries its own."""
        if self.speedup is None:
            return None
        if self.paired:
            reason = busy_reason(self.result.machine_load)
            return f"paired, but {reason}" if reason else None
        reasons = [f"{side}: {reason}" for side, reason in (("the case's rounds", busy_reason(self.result.machine_load)),
                                                            ("its baseline's", busy_reason(self.baseline.machine_load)))
                   if reason]
        return "unpaired; " + "; ".join(reasons) if reasons else None

    @property
    def budget_status(self) -> str:
        return budget_status(self._budget_field())

    def _budget_field(self) -> dict:
        """The record's ``budget``: its status, the device section and file, and every bound checked."""
        if self.budget is None:
            return {"status": "none", "reason": self.budget_missing, "required": self.budget_required}
        return {
            # an entry with no bound where one is required checks nothing: it fails (``Judge.check_budget``)
            "status": ("fail" if any(not v.ok and v.inconclusive is None for v in self.bound_checks)
                       or (self.budget_required and not self.budget.bounds) else
                       "inconclusive" if any(v.inconclusive for v in self.bound_checks) else "pass"),
            "device_key": self.budget.device_key, "file": str(self.budget.path) if self.budget.path else None,
            "checks": [{"key": v.bound.key, "measured": v.measured, "limit": v.bound.limit, "ok": v.ok,
                        "message": v.message, "inconclusive": v.inconclusive} for v in self.bound_checks],
        }

    def budget_failures(self) -> list[str]:
        """One line per budget bound this case failed (inconclusive ones are not failures)."""
        return [f"{self.case} [{self.budget.device_key}]: {v.message}" for v in self.bound_checks
                if not v.ok and v.inconclusive is None]

    @property
    def inconclusive(self) -> list[str]:
        """One line per timed budget the rounds could not judge (noise, a busy machine)."""
        return [f"{self.case} [{self.budget.device_key}]: inconclusive: {v.message}: {v.inconclusive}"
                for v in self.bound_checks if v.inconclusive is not None]

    def record(self) -> dict:
        """The case's serialized form (the saved run, asv, the gate, the report)."""
        fields: dict = {"baseline": self.baseline_recipe.name if self.baseline_recipe else None,
                        "speedup_vs_baseline": self.speedup, "paired": self.paired,
                        "baseline_samples_per_s": self.baseline.samples_per_s if self.speedup is not None else None,
                        "speedup_doubt": self.speedup_doubt}
        fields["budget"] = self._budget_field()
        if self.guard_checks:
            fields["guard"] = {
                "baseline": self.baseline_recipe.name,
                "checks": [{"kind": v.kind, "ok": v.ok, "max_rel_diff": v.max_rel_diff, "message": v.message,
                            "rtol": self.recipe.loss_rtol if v.kind == "loss" else self.recipe.grad_rtol,
                            "losses": v.losses, "baseline_losses": v.baseline_losses} for v in self.guard_checks],
            }
        if self.ladder is not None:
            fields["ladder"] = self.ladder
        if self.trace is not None:
            fields["trace"] = self.trace
        record = case_record(self.result, **fields)
        if record["ranks"] and self.speedup is not None:
            ranks = record["ranks"] = {**record["ranks"], "speedup_vs": self.baseline_recipe.name}
            efficiency = scaling_efficiency(self.result, self.baseline)
            if efficiency is not None:
                ranks["scaling_efficiency"] = efficiency
        return record


def scaling_efficiency(ranks: Result, reference: Result | None) -> float | None:
    """The textbook scaling efficiency of a rank case: its samples/s over ``ideal_speedup`` times the samples/s of
    one process on one device at the same per-rank batch (``ideal_speedup``: the devices the ranks use, 1 on the
    CPU, whose ranks split one process's cores). None where ``reference`` is not such a run: ranks itself, several
    devices in one process (DataParallel), or another batch (one process training the global batch)."""
    if not ranks.ranks or reference is None or not reference.samples_per_s or not ranks.samples_per_s:
        return None
    one_device = not reference.ranks and reference.config.get("parallel") is None
    if not one_device or reference.batch_size != ranks.batch_size:
        return None
    return ranks.samples_per_s / (ranks.ranks["ideal_speedup"] * reference.samples_per_s)


def failed_without_result(outcome: CaseOutcome, error: str) -> CaseOutcome:
    """A case that ended before it had a result: no numbers, one line saying why."""
    return replace(outcome, result=None, baseline=None, error=error, failures=(*outcome.failures, error))
