"""``summary.md``: the night's steps, then each case as the plan saw it and as the night found it, and what
differed."""

from __future__ import annotations

from pathlib import Path

from trainbench.core.analyses.roofline import versus_measured
from trainbench.core.harness.files import write_text_atomic
from trainbench.core.setups.eligibility import HEADROOM
from trainbench.jobs.night_archive import ARCHIVE_LIMIT_BYTES
from trainbench.jobs.night_manifest import Night
from trainbench.jobs.night_plan import PlanFileError, planned_peak_mib, read_plan
from trainbench.jobs.night_results import CaseOutcomeLine, night_results
from trainbench.jobs.night_schedule import SMOKE_CAP_S, finish_reserve, night_node_ids
from trainbench.verdicts.render import Column, Table, number
from trainbench.verdicts.store import SavedRun


def write_summary(night: Night, out: Path) -> str:
    lines = summary_lines(night, out)
    write_text_atomic(out / "summary.md", "\n".join(lines) + "\n")
    return f"{len(lines)} lines"


def _summary_head(night: Night, run: SavedRun | None, plan: dict | None) -> list[str]:
    """The summary's title (which night, of what device) and what the night chose or left out."""
    device = (run.device or {}).get("name") if run is not None else None
    plan_gpu = (plan or {}).get("gpu", {}).get("name")
    what = "CPU night" if night.device == "cpu" and not night.simulate_gpu else "GPU night"
    name = night.simulate_gpu or device or plan_gpu or ("this CPU" if night.device == "cpu" else "this GPU")
    kind = "simulated: nothing measured" if night.simulate_gpu else "measured"
    lines = [f"# {what}: {name} ({kind})", "",
             f"Budget {night.budget_s:g} s; python {night.python}."
             + (" Interrupted." if night.interrupted else "") + (f" Verdict: {night.verdict}." if night.verdict else "")]
    if night.profile:
        lines += ["", f"Profile: {night.profile['name']} ({night.profile['why']}); pytest "
                      f"`{' '.join(night.profile['pytest_args']) or '(the defaults)'}`."]
    if plan_gpu and device and plan_gpu != device:
        lines += ["", f"The plan is of {plan_gpu}, the run of {device}: their rows compare different GPUs."]
    if night.after:
        lines += ["", f"After {night.after}: the {len(night.measured_before)} cases it measured went last, behind "
                      "those it did not."]
    if night.archive_left_out:
        lines += ["", f"Left out of the archive to fit {ARCHIVE_LIMIT_BYTES / 2**20:.0f} MiB (still in the night's "
                      f"folder): {', '.join(night.archive_left_out)}."]
    if night.deselected:
        lines += ["", "Not run, with why:", ""] + [f"- {case}: {why}" for case, why in night.deselected.items()]
    return lines


def _night_plan(out: Path) -> tuple[dict | None, str | None]:
    """The plan beside the night (``night_plan.read_plan``), or why it is left out of the summary: the run's own
    figures still stand."""
    if not (out / "plan.json").exists():
        return None, None
    try:
        return read_plan(out / "plan.json"), None
    except PlanFileError as e:
        return None, str(e)


def summary_lines(night: Night, out: Path) -> list[str]:
    """summary.md: the steps, then each case as the plan saw it and as the night found it, and what differed."""
    plan, plan_problem = _night_plan(out)
    run, measured, reported = night_results(out)
    lines = _summary_head(night, run, plan)
    if plan_problem:
        lines += ["", f"The plan is left out: {plan_problem}."]
    lines += ["", "## Steps", ""]
    lines += _table(("step", "status", "s", "note"),
                    [(s.name, s.status, "" if s.seconds is None else f"{s.seconds:.0f}", s.note or s.why)
                     for s in night.steps if s.name != "summary"])  # this file, being written
    planned = {c["case"]: c for c in (plan or {}).get("cases", [])}
    rows, differs, bounds = [], [], []
    for case in dict.fromkeys([*planned, *reported, *measured]):
        p, r, m = planned.get(case), reported.get(case), measured.get(case)
        plan_text = ("-" if p is None else f"skip: {p['skipped']}" if p.get("skipped") else
                     f"PROBLEM: {p['problem']}" if p.get("problem") else "run")
        night_text = ("measured (the session stopped before its report)" if r is None and m else
                      "not reached" if r is None else "would run (simulated)" if _would_run(r) else
                      r.outcome + (f": {r.message}" if r.message else ""))
        predicted = planned_peak_mib(p) if p else None
        peak = m.get("peak_memory_mib") if m else None
        speed = m.get("samples_per_s") if m else None
        roofline = (p or {}).get("roofline") or ""
        # what a case cost where it ran; a skip's instant is no cost worth a column
        seconds = (r.seconds if r and r.outcome != "skipped" and r.seconds is not None else
                   (m or {}).get("case_seconds"))
        predicted_s = (p or {}).get("predicted_s")
        rows.append((case, plan_text, night_text, roofline, *(number(v, ".1f" if isinstance(v, float) else "")
                                                               for v in (predicted_s, seconds, speed, peak, predicted))))
        difference = _difference(p, r, peak, predicted and predicted * HEADROOM)
        if difference:
            differs.append(f"- {case}: {difference}")
        step_ms, bound_s = (m or {}).get("step_time_ms"), (p or {}).get("bound_s")
        if step_ms and bound_s:
            bounds.append(f"- {case}: {versus_measured(bound_s, step_ms / 1000)}")
    lines += ["", "## Cases", "",
              "Plan: `python -m trainbench plan --simulate-gpu` of the same GPU (roofline: what bounds its step and "
              "the bound; predicted MiB: its own tensor peak, without the memory gate's headroom); night: the pytest outcome "
              "of the case; pred s: its seconds in the session as the plan predicted them (`plan --seconds-from` an "
              "earlier night); case s: its wall seconds in the night's session (what the next night's order and "
              "budget are sized by).", ""]
    lines += _fit_lines(night, planned)
    lines += _table(("case", "plan", "night", "roofline", "pred s", "case s", "samples/s", "peak MiB",
                     "predicted MiB"), rows, text_columns=4)
    lines += ["", "## What differed from the plan", ""] + (differs or ["- nothing"])
    if bounds:
        lines += ["", "## Measured steps against the roofline's bound", ""] + bounds
    if plan is None:
        lines += ["", "No plan was made (see the plan step): nothing to compare with."]
    return lines


# What the doctor step takes on a GPU box before the cases can start (17 s on the first H200 night), kept back from
# the cases' window where the plan's seconds are set against the budget.
DOCTOR_S = 20.0


def _fit_lines(night: Night, planned: dict[str, dict]) -> list[str]:
    """Which cases the budget fits by the plan's predicted seconds: the cases' window (the budget less the finish
    reserve, the doctor and the smoke step's cap) against their sum in the night's order."""
    if not any(c.get("predicted_s") is not None for c in planned.values()):
        return []
    window = night.budget_s - finish_reserve(night.budget_s, False) - DOCTOR_S - SMOKE_CAP_S
    order = [n[n.index("[") + 1:-1] for n in night_node_ids(night.deselected, night.measured_before)]
    runs = [planned[c] for c in order if c in planned and not planned[c].get("skipped") and not planned[c].get("problem")]
    spent, fitting = 0.0, 0
    for case in runs:
        if case.get("predicted_s") is None:
            break
        spent += case["predicted_s"]
        if spent > window:
            break
        fitting += 1
    last = f", through {runs[fitting - 1]['case']}" if fitting else ""
    stop = (f"; then {runs[fitting]['case']}" + (" (not predicted)" if runs[fitting].get("predicted_s") is None else
                                                  f" would end at ~{spent:.0f} s")) if fitting < len(runs) else ""
    return [f"By the plan's predicted seconds, a {night.budget_s:g} s night's cases step (~{window:.0f} s: the budget "
            f"less the finish reserve, ~{DOCTOR_S:g} s of doctor and the smoke step's {SMOKE_CAP_S:g} s cap) fits "
            f"{fitting} of the {len(runs)} cases that run{last}{stop}.", ""]


def _table(titles: tuple[str, ...], rows: list[tuple[str, ...]], text_columns: int | None = None) -> list[str]:
    text_columns = len(titles) if text_columns is None else text_columns
    columns = tuple(Column(title, left=i < text_columns) for i, title in enumerate(titles))
    return Table(columns, tuple(rows)).markdown()


def _difference(planned: dict | None, reported: CaseOutcomeLine | None, peak: float | None,
                predicted: float | None) -> str | None:
    if planned is None or reported is None:
        return None
    plan_runs = not planned.get("skipped") and not planned.get("problem")
    if plan_runs and reported.outcome == "skipped" and not _would_run(reported):
        return f"planned to run, skipped: {reported.message}"
    if not plan_runs and reported.outcome != "skipped":
        return f"planned to skip ({planned.get('skipped') or planned.get('problem')}), {reported.outcome}"
    if reported.outcome in ("failed", "error"):
        return f"{reported.outcome}: {reported.message}"
    if peak and predicted and peak > predicted:
        return f"measured peak {peak:.0f} MiB above the predicted {predicted:.0f} MiB (with headroom)"
    return None


def _would_run(reported: CaseOutcomeLine) -> bool:
    """A rehearsal's skip of a case the simulated GPU would run (``--trainbench-simulate-gpu``)."""
    return reported.outcome == "skipped" and "would run on simulated" in reported.message
