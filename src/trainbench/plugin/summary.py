"""The terminal summary of a trainbench session: the case table, the notes that explain it, the verdict, and the
log's last lines (the gate's decision, a run not saved)."""

from __future__ import annotations

import os
import statistics
import time

from trainbench.devices.environment import ENVIRONMENT_KEYS
from trainbench.verdicts.present import (
    INCONCLUSIVE, Line, Section, costs_lines, last_line, nothing_compared, summary_table, verdict_sections,
    vs_base_lines, write_terminal)
from trainbench.verdicts.render import NOT_PREDICTED


def write_terminal_summary(terminalreporter, state) -> None:
    """The A/B verdict or the summary of the cases, what a comparison that compared nothing says, and a run that
    could not be saved."""
    comparison = state.gate.comparison
    nothing = comparison is not None and comparison.nothing_compared
    if state.ab is not None and comparison is not None and not nothing:
        write_ab(terminalreporter, comparison)
    elif state.recorded.cases or state.recorded.failed_cases:
        write_summary(terminalreporter, state)
    if nothing:
        write_nothing_compared(terminalreporter, comparison)
    saving = state.saving
    if saving.problem is not None:  # after the numbers it would have kept
        terminalreporter.write_line(f"trainbench: --benchmark-save: the run was not saved in "
                                    f"{saving.saved or 'its storage'}: {saving.problem}; its numbers are only "
                                    "in this summary", red=True)


def write_last_lines(reporter, state) -> None:
    """After pytest's "N passed in T s": the gate's decision and the exit status, then whether the run was saved,
    as the log's last lines."""
    gate, saving = state.gate, state.saving
    if gate.comparison is not None and gate.exit_status is not None:
        line = last_line(gate.comparison.to_json(), gate.exit_status)
        reporter.write_line(line, red=gate.comparison.failed, green=not gate.comparison.failed, bold=True)
    # last: a run not saved is a failed run, whatever the gate said; one saved under a SIGTERM says so
    status = f" (exit {gate.exit_status})" if gate.exit_status is not None else ""
    if saving.problem is not None:
        reporter.write_line(f"trainbench: FAILED: the run was not saved{status}", red=True, bold=True)
    elif state.stopping.late_sigterms:
        saved = f"; the run was saved whole in {saving.saved}" if saving.saved is not None else ""
        reporter.write_line(f"trainbench: stopped by SIGTERM after the last case{saved}{status}", red=True, bold=True)


def write_summary(terminalreporter, state) -> None:
    """Every measured case's row, then what the reader must know about them: failures, inconclusive timings,
    ratios timed on a busy machine or unpaired, predictions, ranks, relaunches, batch shapes that vary, traces, and
    the comparison with the baseline."""
    terminalreporter.write_sep("=", "trainbench summary")
    backend = state.machine.backend
    terminalreporter.write_line(f"device: {backend.name} ({backend.kind}), profile {state.machine.runner.profile.name}")
    load = (state.doctor or {}).get("load_average")
    if load:
        terminalreporter.write_line(f"load average (1 min): {load['start'][0]:.2f} at start, "
                                    f"{os.getloadavg()[0]:.2f} now, on {os.cpu_count()} CPUs")
    for check in (state.doctor or {}).get("checks", []):
        if check["status"] in ("warn", "FAIL"):
            terminalreporter.write_line(f"doctor {check['status']}: {check['name']}: {check['message']}", yellow=True)
    records = [measured.record for measured in state.recorded.cases]
    for line in summary_table(records):
        terminalreporter.write_line(line)
    for failed in state.recorded.failed_cases:
        terminalreporter.write_line(f"FAILED {failed['error']}", red=True)
    for line in state.recorded.inconclusive:  # a budget's timing not judged reads as a comparison's does
        terminalreporter.write_line(f"{INCONCLUSIVE} {line} (measured twice; not failed: --trainbench-strict-timing "
                                    "fails it)", yellow=True)
    write_terminal(terminalreporter, [Section(lines=tuple(vs_base_lines(records)))])
    if records and state.options.attribution_left_out and not state.options.quick:
        terminalreporter.write_line(f"attribution: not taken ({state.options.attribution_left_out})")
    for line, failed in _prediction_lines(records):
        terminalreporter.write_line(line, yellow=failed)
    if state.predicted_ahead is not None:  # seconds before the first case that no case's costs hold
        terminalreporter.write_line(state.predicted_ahead.line())
    for r in records:
        if r.ranks:
            terminalreporter.write_line(_ranks_line(r.case, r.ranks))
        for note in r.relaunches:  # measured whole by the relaunch; the crash is shown, not hidden
            terminalreporter.write_line(f"{r.case}: {note}", yellow=True)
        if r.varying_shapes:  # its GFLOP/sample and memory are those of a fixed window of batches, not of every batch
            terminalreporter.write_line(f"{r.case}: {r.varying_shapes}")
    for case, trace in state.recorded.traces:
        terminalreporter.write_line(f"profile trace {case}: " + (
            ", ".join(trace["files"]) if "files" in trace else
            f"not written: {trace['error']}" if "error" in trace else f"not taken: {trace['skipped']}"),
            yellow="error" in trace)
    if state.options.costs:
        terminalreporter.write_sep("-", "trainbench costs: each case's wall seconds by phase (docs/method.md)")
        for line in costs_lines(records, time.monotonic() - state.started_s):
            terminalreporter.write_line(line)
    if state.gate.comparison is not None and not state.gate.comparison.nothing_compared:
        _write_comparison(terminalreporter, state)


def write_ab(terminalreporter, verdict) -> None:
    """The A/B verdict: both environments, the table, and one line per regression and numerics change."""
    sides = []
    for label, side in verdict.sides.items():
        ident = side["identity"]
        extras = ", ".join(f"{k} {ident[k]}" for k in ENVIRONMENT_KEYS if k != "torch" and ident.get(k))
        sides.append(Line(f"{label}: {side['python']}: torch {ident.get('torch')}" + (f", {extras}" if extras else "")
                          + f", {ident.get('name')}"))
    write_terminal(terminalreporter, verdict_sections(verdict.to_json(), preface=tuple(sides), every_row=True))


def _prediction_lines(records) -> list[tuple[str, bool]]:
    """What the "GPU pred" column holds, how far the method's check on this run's own setups went (a case whose own
    setup was not predicted is not counted as exact), and one line per reason a prediction could not be made, with
    its cases; (line, whether it says something failed)."""
    predicted = [r for r in records if r.metrics.get("predicted_gpu_peak_mib") is not None]
    lines = []
    if predicted:
        mismatched = [r.case for r in predicted if r.prediction_matches is False]
        exact = sum(r.prediction_matches is True for r in predicted)
        if mismatched:
            check = f"; {exact} of {len(predicted)} cases' own setup predicted exactly as measured"
        elif exact == len(predicted):
            check = "; each case's own setup predicted exactly as measured"
        else:
            check = (f"; own setup predicted exactly as measured for {exact} of {len(predicted)} cases, the others not "
                     "checked (their own setup not predicted or its breakdown not measured)")
        lines.append(("GPU pred: the GPU profile's tracked tensor peak predicted under FakeTensorMode (no allocator "
                      "cache, workspaces or CUDA context)" + check, False))
        if mismatched:  # the cell's mark, on a line of its own that starts with it
            lines.append((f"GPU pred !: the prediction of this run's own setup differs from its measured breakdown "
                          f"(the method's check failed): {', '.join(mismatched)}", True))
    reasons: dict[str, list[str]] = {}
    for r in records:
        if r.prediction_failure:
            reasons.setdefault(r.prediction_failure, []).append(r.case)
    for reason, cases in reasons.items():
        lines.append((f"GPU pred {NOT_PREDICTED} for {', '.join(cases)}: {reason}", True))
    return lines


def _ranks_line(case: str, ranks: dict) -> str:
    """One line per distributed case: launcher, ranks, scaling, gradients, each rank's median step."""
    medians = ", ".join(f"{statistics.median(r['round_step_times_s']) * 1e3:.1f}" for r in ranks["per_rank"])
    if "scaling_efficiency" in ranks:
        scaling = (f"scaling efficiency {ranks['scaling_efficiency']:.2f} vs {ranks['speedup_vs']} (ideal speed-up "
                   f"{ranks['ideal_speedup']:g}x)")
    elif "speedup_vs" in ranks:
        scaling = (f"compared with {ranks['speedup_vs']}, not one process on one device at the per-rank batch: no "
                   "scaling efficiency")
    else:
        scaling = "no scaling efficiency (no ratio budget asked for its one-process baseline)"
    spread = ranks["max_grad_difference_between_ranks"]
    return (f"ranks {case}: {ranks['world_size']} under {ranks['launcher']}, {ranks['dist_backend']}; {scaling}; "
            f"gradients {'identical on every rank' if not spread else f'DIFFER by {spread:.3g}'}; "
            f"median step per rank {medians} ms")


def write_nothing_compared(terminalreporter, verdict) -> None:
    """A comparison that compared nothing: under a gate it fails (``Verdict.failed``), without one it is said."""
    write_terminal(terminalreporter, nothing_compared(verdict.to_json()))


def _write_comparison(terminalreporter, state) -> None:
    """The verdict against the baseline run (``trainbench.verdicts.present``), after which run it is and why."""
    baseline = state.baseline_used()
    chosen = () if baseline is None else (Line(f"compared with {baseline.path}: {baseline.why}"),)
    write_terminal(terminalreporter, verdict_sections(state.gate.comparison.to_json(), preface=chosen, every_row=True))
