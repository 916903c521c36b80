"""The terminal summary of a trainbench session: the case table, the notes that explain it, the verdict."""

from __future__ import annotations

import os


def write_summary(terminalreporter, state) -> None:
    """Every measured case's row, then what the reader must know about them: failures, inconclusive timings,
    unpaired ratios, predictions, ranks, relaunches, traces, and the comparison with the baseline."""
    from .report import summary_table

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
    for line in state.inconclusive:
        terminalreporter.write_line(f"INCONCLUSIVE {line} (measured twice; not failed: --trainbench-strict-timing "
                                    "fails it)", yellow=True)
    if any(r.speedup_vs_baseline is not None and not r.paired for r in records):
        terminalreporter.write_line("~ vs base unpaired: the baseline's rounds were timed apart from the case's "
                                    "(no ratio budget asked for interleaving), so machine drift is in the ratio")
    for line, failed in _prediction_lines(records):
        terminalreporter.write_line(line, yellow=failed)
    for r in records:
        if r.ranks:
            terminalreporter.write_line(_ranks_line(r.case, r.ranks))
        for note in r.relaunches:  # measured whole by the relaunch; the crash is shown, not hidden
            terminalreporter.write_line(f"{r.case}: {note}", yellow=True)
    for case, trace in state.traces:
        terminalreporter.write_line(f"profile trace {case}: " + (
            ", ".join(trace["files"]) if "files" in trace else
            f"not written: {trace['error']}" if "error" in trace else f"not taken: {trace['skipped']}"),
            yellow="error" in trace)
    if state.comparison is not None and not state.comparison.nothing_compared:
        _write_comparison(terminalreporter, state)


def write_ab(terminalreporter, state) -> None:
    """The A/B verdict: both environments, the table, and one line per regression and numerics change."""
    from .environment import ENVIRONMENT_KEYS

    verdict = state.comparison
    terminalreporter.write_sep("=", "trainbench A/B: base vs head, rounds alternating ABBA, compared pair by pair")
    for label, side in verdict.sides.items():
        ident = side["identity"]
        extras = ", ".join(f"{k} {ident[k]}" for k in ENVIRONMENT_KEYS if k != "torch" and ident.get(k))
        terminalreporter.write_line(f"{label}: {side['python']}: torch {ident.get('torch')}"
                                    + (f", {extras}" if extras else "") + f", {ident.get('name')}")
    _write_verdict_table(terminalreporter, verdict)
    if verdict.not_measured:
        from .gate import not_measured_line

        terminalreporter.write_line(not_measured_line(verdict.not_measured), yellow=True)
    for outcome in state.ab.outcomes:
        if outcome.guard is not None and not outcome.guard.ok:
            terminalreporter.write_line(f"NUMERICS {outcome.case}: head vs base: {outcome.guard.message}", yellow=True)
    _write_findings(terminalreporter, verdict)


def _prediction_lines(records) -> list[tuple[str, bool]]:
    """What the "GPU pred" column holds, how far the method's check on this run's own setups went (a case whose own
    setup was not predicted is not counted as exact), and one line per reason a prediction could not be made, with
    its cases; (line, whether it says something failed)."""
    from .render import NOT_PREDICTED

    predicted = [r for r in records if r.metrics.get("predicted_gpu_peak_mib") is not None]
    lines = []
    if predicted:
        mismatched = [r.case for r in predicted if r.prediction_matches is False]
        exact = sum(r.prediction_matches is True for r in predicted)
        if mismatched:
            check = f"; ! prediction of this run's own setup differs from its measured breakdown: {', '.join(mismatched)}"
        elif exact == len(predicted):
            check = "; each case's own setup predicted exactly as measured"
        else:
            check = (f"; own setup predicted exactly as measured for {exact} of {len(predicted)} cases, the others not "
                     "checked (their own setup not predicted or its breakdown not measured)")
        lines.append(("GPU pred: the GPU profile's tracked tensor peak predicted under FakeTensorMode (no allocator "
                      "cache, workspaces or CUDA context)" + check, bool(mismatched)))
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
    failing = verdict.failed
    terminalreporter.write_line(f"{'FAIL ' if failing else ''}trainbench compare vs {verdict.baseline}: nothing "
                                f"compared: {verdict.nothing_compared}"
                                + ("; a gate that saw nothing never passes" if failing else ""), red=failing)


def _write_comparison(terminalreporter, state) -> None:
    verdict = state.comparison
    terminalreporter.write_sep("=", f"trainbench compare vs {verdict.baseline}")
    baseline = state.baseline_used()
    if baseline is not None:
        terminalreporter.write_line(f"compared with {baseline.path}: {baseline.why}")
    _write_verdict_table(terminalreporter, verdict)
    for case in verdict.new_cases:
        failing = verdict.gated and not verdict.new_cases_allowed
        terminalreporter.write_line(f"{'FAIL ' if failing else ''}{case}: not in the baseline run (new case"
                                    + ("; nothing compared: --trainbench-allow-new-cases lets it pass)" if failing
                                       else ")"), red=failing)
    for error in verdict.errors:
        terminalreporter.write_line(f"ERROR {error}", red=True)
    if verdict.not_run:  # deselected or skipped here: the verdict says nothing about them
        terminalreporter.write_line(f"not compared: {len(verdict.not_run)} case(s) of the baseline run did not run in "
                                    f"this session: {', '.join(verdict.not_run[:10])}"
                                    + (", ..." if len(verdict.not_run) > 10 else ""), yellow=True)
    _write_findings(terminalreporter, verdict)


def _write_verdict_table(terminalreporter, verdict) -> None:
    from .gate import environment_line, verdict_table

    gate = "gate: --trainbench-compare-fail" if verdict.gated else "no gate (--trainbench-compare-fail not given)"
    terminalreporter.write_line(gate + "; " + ", ".join(f"{n} {v}" for v, n in verdict.counts.items() if n))
    for line in verdict_table(verdict.comparisons):
        terminalreporter.write_line(line)
    if verdict.environment:
        terminalreporter.write_line(environment_line(verdict.environment), yellow=True)


def _write_findings(terminalreporter, verdict) -> None:
    """A line per comparison that failed the verdict or could have, and per improvement: in red what fails it
    (``Verdict.failed``'s rule), in yellow an inconclusive timing that does not (--trainbench-allow-inconclusive, or
    no gate); under each regression and improvement, where it comes from."""
    from .gate import where_lines

    for c in verdict.comparisons:
        fails = verdict.gated and c.fails(verdict.allow_inconclusive)
        if c.verdict == "inconclusive":
            terminalreporter.write_line(("COULD NOT JUDGE " if fails else "INCONCLUSIVE ") + c.describe(),
                                        red=fails, yellow=not fails)
        if c.verdict == "missing" and verdict.gated:
            terminalreporter.write_line("FAIL " + c.describe(), red=True)
        if c.verdict == "regressed":
            terminalreporter.write_line(("REGRESSION " if fails else "regressed (not gated): ") + c.describe(),
                                        red=fails)
        if c.verdict == "improved":
            terminalreporter.write_line("IMPROVED " + c.describe(), green=True)
        if c.verdict in ("regressed", "improved"):
            for line in where_lines(c.to_json(), verdict.environment):
                terminalreporter.write_line("    " + line)
    if verdict.could_not_judge:
        from .gate import EXIT_COULD_NOT_JUDGE

        unsure = sum(c.verdict == "inconclusive" for c in verdict.comparisons)
        terminalreporter.write_line(
            f"trainbench: COULD NOT JUDGE: {unsure} timed comparison(s) stayed inconclusive after measuring again, "
            f"and nothing regressed (exit status {EXIT_COULD_NOT_JUDGE}; --trainbench-remeasure-s measures longer, "
            "--trainbench-allow-inconclusive reports them without failing)", red=True)
