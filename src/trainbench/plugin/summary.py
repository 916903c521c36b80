"""The terminal summary of a trainbench session: the case table, the notes that explain it, the verdict."""

from __future__ import annotations

import os
import time


def write_summary(terminalreporter, state) -> None:
    """Every measured case's row, then what the reader must know about them: failures, inconclusive timings,
    ratios timed on a busy machine or unpaired, predictions, ranks, relaunches, batch shapes that vary, traces, and
    the comparison with the baseline."""
    from trainbench.verdicts.present import INCONCLUSIVE, Section, summary_table, vs_base_lines, write_terminal

    terminalreporter.write_sep("=", "trainbench summary")
    backend = state.backend
    terminalreporter.write_line(f"device: {backend.name} ({backend.kind}), profile {state.runner.profile.name}")
    load = (state.doctor or {}).get("load_average")
    if load:
        terminalreporter.write_line(f"load average (1 min): {load['start'][0]:.2f} at start, "
                                    f"{os.getloadavg()[0]:.2f} now, on {os.cpu_count()} CPUs")
    for check in (state.doctor or {}).get("checks", []):
        if check["status"] in ("warn", "FAIL"):
            terminalreporter.write_line(f"doctor {check['status']}: {check['name']}: {check['message']}", yellow=True)
    records = [measured.record for measured in state.cases]
    for line in summary_table(records):
        terminalreporter.write_line(line)
    for failed in state.failed_cases:
        terminalreporter.write_line(f"FAILED {failed['error']}", red=True)
    for line in state.inconclusive:  # a budget's timing not judged reads as a comparison's does
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
    for case, trace in state.traces:
        terminalreporter.write_line(f"profile trace {case}: " + (
            ", ".join(trace["files"]) if "files" in trace else
            f"not written: {trace['error']}" if "error" in trace else f"not taken: {trace['skipped']}"),
            yellow="error" in trace)
    if state.options.costs:
        from trainbench.verdicts.present import costs_lines

        terminalreporter.write_sep("-", "trainbench costs: each case's wall seconds by phase (docs/method.md)")
        for line in costs_lines(records, time.monotonic() - state.started_s):
            terminalreporter.write_line(line)
    if state.comparison is not None and not state.comparison.nothing_compared:
        _write_comparison(terminalreporter, state)


def write_ab(terminalreporter, state) -> None:
    """The A/B verdict: both environments, the table, and one line per regression and numerics change."""
    from trainbench.devices.environment import ENVIRONMENT_KEYS
    from trainbench.verdicts.present import Line, verdict_sections, write_terminal

    verdict = state.comparison
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
    from trainbench.verdicts.render import NOT_PREDICTED

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
    import statistics

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
    from trainbench.verdicts.present import nothing_compared, write_terminal

    write_terminal(terminalreporter, nothing_compared(verdict.to_json()))


def _write_comparison(terminalreporter, state) -> None:
    """The verdict against the baseline run (``trainbench.verdicts.present``), after which run it is and why."""
    from trainbench.verdicts.present import Line, verdict_sections, write_terminal

    baseline = state.baseline_used()
    chosen = () if baseline is None else (Line(f"compared with {baseline.path}: {baseline.why}"),)
    write_terminal(terminalreporter, verdict_sections(state.comparison.to_json(), preface=chosen, every_row=True))
