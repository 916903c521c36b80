"""How a verdict and a session's cases read, in the terminal and in Markdown.

A verdict (``gate.Verdict``'s JSON form, live or read back from ``--trainbench-compare-json``'s file) with its
explanation ("where") and environment differences becomes a list of ``Section``s once: a title, lines that each
lead with their outcome's words, a table. ``terminal`` and ``markdown`` only lay them out, so an outcome reads the
same in the session summary, in ``python -m trainbench explain`` and in a CI job's Markdown. This module is the
one place that gives a verdict's outcomes their words (``STATUS``, ``FINDING``). ``summary_table`` is the
session's table of its cases. Figures are formatted by ``trainbench.verdicts.render``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainbench.core.harness.costs import OTHER, PHASES, TOTAL, by_phase, timed_rounds_s
from trainbench.core.records.stats import ALPHA_SIDE, busy_reason, level
from trainbench.verdicts.gate import EXIT_COULD_NOT_JUDGE, decision, fails_gate
from trainbench.verdicts.render import MISSING, NOT_PREDICTED, Column, Table, change, interval, listed, number

if TYPE_CHECKING:
    from trainbench.core.records.result import CaseRecord

# A gate's decision, as its title, the session's last line and the Markdown heading say it.
STATUS = {"could_not_judge": "COULD NOT JUDGE", "failed": "FAILED", "passed": "passed", "not_gated": "not gated"}
NOT_COMPARED = "not compared:"  # cases and metrics a verdict says nothing about
FAIL, ERROR, NUMERICS = "FAIL", "ERROR", "NUMERICS"
# The words that lead a comparison's line, by its outcome and whether it fails the gate ((fails, does not)).
# "COULD NOT JUDGE" is the gate's decision alone (``STATUS``): a comparison that stayed inconclusive under a gate that
# FAILED for a regression must not read as that decision.
FINDING = {"regressed": ("REGRESSION", "regressed (not gated):"),
           "inconclusive": ("INCONCLUSIVE (fails the gate)", "INCONCLUSIVE"),
           "improved": ("IMPROVED", "IMPROVED"), "missing": (FAIL, NOT_COMPARED)}
INCONCLUSIVE = FINDING["inconclusive"][1]  # a timing not judged that fails nothing (a budget's, too)
# The terminal's colour for a line's tone.
TONES = {"fail": {"red": True}, "warn": {"yellow": True}, "good": {"green": True}, "": {}}

ENVIRONMENT_LISTED = 10  # differences the environment line names (a CUDA upgrade moves a dozen packages)
ENVIRONMENT_SHOWN = 3  # differences named under each changed verdict (the header names ENVIRONMENT_LISTED, the JSON all)
NOT_RUN_LISTED = 10  # case names a "not compared" line lists before "and N more"


@dataclass(frozen=True)
class Line:
    text: str
    label: str = ""  # the outcome's words, first: bold in Markdown
    tone: str = ""  # a key of TONES
    under: tuple[str, ...] = ()  # lines beneath it (what accounts for a change)


@dataclass(frozen=True)
class Section:
    title: str | None = None  # "{}" in it are filled with ``names`` (code in Markdown)
    names: tuple[str, ...] = ()
    lines: tuple[Line, ...] = ()
    table: Table | None = None
    empty: str = ""  # said in place of a table without rows
    folded: Table | None = None  # the whole table, folded away under ``table`` in Markdown (not in the terminal)


# -- the renderers ---------------------------------------------------------------------------------------------------

def _said(line: Line, bold: bool = False) -> str:
    label = f"**{line.label}**" if bold and line.label else line.label
    return f"{label} {line.text}" if label else line.text


def terminal(sections: list[Section]) -> list[tuple[str, dict, bool]]:
    """Each printed line as (text, its terminal markup, whether it is a title)."""
    out = []
    for s in sections:
        if s.title:
            out.append((s.title.format(*s.names), {}, True))
        for line in s.lines:
            out.append((_said(line), TONES[line.tone], False))
            out += [("    " + text, {}, False) for text in line.under]
        if s.table is not None:
            out += [(text, {}, False) for text in (s.table.terminal() if s.table.rows else [s.empty])]
    return out


def terminal_lines(sections: list[Section]) -> list[str]:
    return [text for text, _, _ in terminal(sections)]


def write_terminal(terminalreporter, sections: list[Section]) -> None:
    """The sections on pytest's terminal: a title as a rule, each line in its tone's colour."""
    for text, markup, title in terminal(sections):
        if title:
            terminalreporter.write_sep("=", text)
        else:
            terminalreporter.write_line(text, **markup)


def markdown(sections: list[Section]) -> str:
    """GitHub-flavoured Markdown: a title as a heading, lines as a list, each table with the whole one folded."""
    out: list[str] = []
    for s in sections:
        if s.title:
            out += ["### " + s.title.format(*(f"`{name}`" for name in s.names)), ""]
        for line in s.lines:
            out.append("- " + _said(line, bold=True))
            out += [f"  - {text}" for text in line.under]
        if s.lines:
            out.append("")
        if s.table is not None:
            out += (s.table.markdown() if s.table.rows else [s.empty]) + [""]
        if s.folded is not None and s.folded.rows:
            out += [f"<details><summary>all {len(s.folded.rows)} comparisons</summary>", ""]
            out += s.folded.markdown() + ["", "</details>", ""]
    return "\n".join(out).rstrip("\n") + "\n"


# -- a verdict as sections -------------------------------------------------------------------------------------------

_COLUMNS = (Column("case", left=True), Column("metric", left=True), Column("baseline"), Column("current"),
            Column("change"), Column("95% CI"), Column("verdict", left=True))


def comparison_table(comparisons: list[dict]) -> Table:
    """A comparison per row, from its JSON form (``MetricComparison.to_json``, or a verdict file's)."""
    return Table(_COLUMNS, tuple((c["case"], c["metric"], number(c.get("baseline")), number(c.get("current")),
                                  change(c.get("change")), _ci_cell(c), c["verdict"]) for c in comparisons))


def _ci_cell(comparison: dict) -> str:
    """The interval, with its confidence where a later look made it other than the 95% the column says
    (``stats.look_alpha``)."""
    said, one_look = comparison.get("ci_level"), level(ALPHA_SIDE)
    return interval(comparison.get("ci")) + (f" ({said})" if comparison.get("ci") and said not in (None, one_look) else "")


def verdict_table(comparisons) -> list[str]:
    """A fixed-width table of ``gate.MetricComparison``s: case, metric, baseline, current, change, interval, verdict."""
    return comparison_table([c.to_json() for c in comparisons]).terminal()


def status(verdict: dict) -> str:
    """The gate's decision (``STATUS``), from the verdict's JSON form."""
    return STATUS[decision(verdict)]


def environment_line(differences) -> str:
    """The line that says which software differs between the compared runs (the verdict JSON lists them all)."""
    return ("environment differs from the baseline: " + listed(differences, ENVIRONMENT_LISTED, "; ")
            + " (a change may come from these rather than the code)")


def where_lines(comparison: dict, environment) -> list[str]:
    """The lines under a regressed or improved comparison (its JSON form): what accounts for it, and the software
    that differs between the sides (a likely cause too)."""
    lines = list(comparison.get("explanation") or [])
    if lines and environment:
        lines.append("environment: " + listed(environment, ENVIRONMENT_SHOWN, "; "))
    return lines


def _title(verdict: dict) -> Section:
    """What was compared, and the gate's decision (``status``)."""
    gate = f"gate {status(verdict)}" if verdict.get("gated") else "no gate (--trainbench-compare-fail not given)"
    if verdict.get("ab") is not None:
        return Section(f"trainbench A/B: base vs head, rounds alternating ABBA, compared pair by pair: {gate}")
    return Section(f"trainbench compare vs {{}}: {gate}", (str(verdict.get("baseline")),))


def _head(verdict: dict, preface: tuple[Line, ...]) -> Section:
    """What was compared: the caller's lines, the counts, the software that differs, what neither side measured."""
    comparisons = verdict.get("comparisons") or []
    counts = ", ".join(f"{n} {outcome}" for outcome, n in (verdict.get("counts") or {}).items() if n)
    lines = [*preface, Line(f"{len(comparisons)} comparison(s) of {len({c['case'] for c in comparisons})} case(s): "
                            + counts if counts else "nothing compared")]
    if verdict.get("environment_differs"):
        lines.append(Line(environment_line(verdict["environment_differs"]), tone="warn"))
    if verdict.get("not_measured"):
        lines.append(Line(f"{', '.join(verdict['not_measured'])}: measured by neither side here", NOT_COMPARED,
                          "warn"))
    return Section(lines=tuple(lines))


def _comparisons(verdict: dict, every_row: bool) -> Section:
    """The table: every comparison (``every_row``), or those not unchanged with the whole table folded away."""
    comparisons = verdict.get("comparisons") or []
    if every_row:
        return Section(table=comparison_table(comparisons))
    notable = [c for c in comparisons if c.get("verdict") not in ("unchanged", "missing")]
    return Section(table=comparison_table(notable), empty="nothing changed beyond the thresholds",
                   folded=comparison_table(comparisons))


def _cases_not_compared(verdict: dict, judged: bool, current: str) -> list[Line]:
    """The cases only one side has, and the baseline's cases that could not be read."""
    new, gated = verdict.get("new_cases") or [], judged and verdict.get("gated")
    lines = []
    if gated and not verdict.get("new_cases_allowed"):
        lines += [Line(f"{case}: not in the baseline run (new case; nothing compared: --trainbench-allow-new-cases "
                       "lets it pass)", FAIL, "fail") for case in new]
    elif new:
        lines.append(Line(f"{len(new)} case(s) of {current} not in the baseline run: "
                          + listed(new, NOT_RUN_LISTED), NOT_COMPARED))
    lines += [Line(error, ERROR, "fail") for error in verdict.get("errors") or []]
    not_run = verdict.get("not_run") or []
    if not_run:  # deselected or skipped: the verdict says nothing about them
        lines.append(Line(f"{len(not_run)} case(s) of the baseline run did not run in {current}: "
                          + listed(not_run, NOT_RUN_LISTED), NOT_COMPARED, "warn"))
    return lines


def _finding(c: dict, verdict: dict, judged: bool) -> Line | None:
    """A comparison's line where it is not unchanged (a metric one side lacks, not failing, is counted apart):
    in red what fails the gate (``gate.fails_gate``), in yellow an inconclusive timing that does not; under a
    regression or improvement, where it comes from."""
    outcome = c.get("verdict")
    fails = bool(judged and verdict.get("gated") and fails_gate(outcome, bool(verdict.get("allow_inconclusive"))))
    if outcome not in FINDING or (outcome == "missing" and not fails):
        return None
    text = c.get("line") or f"{c['case']} {c['metric']}: {outcome}"
    label = FINDING[outcome][0 if fails or (outcome == "regressed" and not judged) else 1]
    tone = "fail" if fails else "warn" if outcome == "inconclusive" else "good" if outcome == "improved" else ""
    under = where_lines(c, verdict.get("environment_differs") or []) if outcome in ("regressed", "improved") else []
    return Line(text, label, tone, tuple(under))


# Beyond this many comparisons that regressed or improved, the report groups them by cause: one block per cause (the
# op, module or site, its line once) with the metrics and cases it moved beneath, and one line per case instead of the
# table. Every comparison, its line and its causes stay in the verdict JSON (--trainbench-compare-json) and `explain`.
GROUPED_BEYOND = 8
CAUSE = "CAUSE"


def grouped(verdict: dict) -> bool:
    """Whether the report groups the verdict's changes by cause (``GROUPED_BEYOND``)."""
    return sum(c.get("verdict") in ("regressed", "improved") for c in verdict.get("comparisons") or []) > GROUPED_BEYOND


@dataclass(frozen=True)
class CauseGroup:
    cause: dict | None  # the cause shown once (``explain.Cause.to_json``); None: the changes no cause explains
    comparisons: tuple[dict, ...]


def cause_key(row: str) -> str | None:
    """What a cause's row names, the same across tables: a module whether forward or backward ran it, an op as the
    dispatcher (``aten.mm``) or the profiler (``aten::mm``) spells it; None for an aggregate (``(other)``,
    ``(outside modules)``), which names nothing to look at."""
    if row.startswith("("):
        return None
    return row.removesuffix(" (backward)").replace("::", ".")


def cause_groups(comparisons: list[dict]) -> list[CauseGroup]:
    """The regressed and improved comparisons grouped by what explains them: the op, module or site (``cause_key``)
    that the most of them name among their causes first (ties: the larger summed share, then the name), headed by its
    cause with the largest share; then the next, over what is left; those that name none, last."""
    changed = [c for c in comparisons if c.get("verdict") in ("regressed", "improved")]
    named = {id(c): [k for k in c.get("causes") or [] if cause_key(k["row"])] for c in changed}
    pending = [c for c in changed if named[id(c)]]
    groups = []
    while pending:
        by_row: dict[str, list[tuple[dict, dict]]] = {}
        for c in pending:
            best: dict[str, dict] = {}  # a comparison counts once per row, by its largest share there
            for cause in named[id(c)]:
                key = cause_key(cause["row"])
                if key not in best or abs(cause.get("share") or 0) > abs(best[key].get("share") or 0):
                    best[key] = cause
            for row, cause in best.items():
                by_row.setdefault(row, []).append((c, cause))
        row = min(by_row, key=lambda r: (-len(by_row[r]), -sum(abs(k.get("share") or 0) for _, k in by_row[r]), r))
        head = max((cause for _, cause in by_row[row]), key=lambda k: abs(k.get("share") or 0))
        taken = [c for c, _ in by_row[row]]
        groups.append(CauseGroup(head, tuple(taken)))
        pending = [c for c in pending if all(c is not t for t in taken)]
    unexplained = tuple(c for c in changed if not named[id(c)])
    return groups + ([CauseGroup(None, unexplained)] if unexplained else [])


def _group_lines(group: CauseGroup, cases: list[str], environment) -> Line:
    """A cause's block: its line, then the cases it moved (where not every case) and each metric's change."""
    outcomes = sorted({c["verdict"] for c in group.comparisons})
    regressed = "regressed" in outcomes
    moved = list(dict.fromkeys(c["case"] for c in group.comparisons))
    under = [f"in every changed case ({len(moved)})" if sorted(moved) == sorted(cases) else
             f"in {len(moved)} of {len(cases)} changed cases: " + listed(moved, NOT_RUN_LISTED)]
    for metric in dict.fromkeys(c["metric"] for c in group.comparisons):
        rows = [c for c in group.comparisons if c["metric"] == metric]
        changes = sorted(c["change"] for c in rows if c.get("change") is not None)
        size = (change(changes[0]) if changes and changes[0] == changes[-1] else
                f"{change(changes[0])}..{change(changes[-1])}" if changes else "")
        where = "" if len(rows) == len(moved) else f" ({', '.join(c['case'] for c in rows)})"
        under.append(f"{metric}: {'/'.join(sorted({c['verdict'] for c in rows}))} {size}{where}".rstrip())
    if group.cause is None:
        reasons = list(dict.fromkeys(line for c in group.comparisons if not c.get("causes")
                                     for line in c.get("explanation") or []))
        aggregates = any(c.get("causes") for c in group.comparisons)
        text = "no op, module or site named" + (f": {'; '.join(reasons[:2])}" if reasons else
                                                " (only aggregates such as (other) moved)" if aggregates else
                                                " (these metrics have no attribution table)")
    else:
        text = group.cause.get("line") or f"{group.cause['table']}: {group.cause['row']}"
    if environment:
        under.append("environment: " + listed(environment, ENVIRONMENT_SHOWN, "; "))
    return Line(text, CAUSE, "fail" if regressed else "good", tuple(under))


def _case_lines(verdict: dict) -> list[Line]:
    """The grouped report's stand-in for the table: one line per case, how many of its metrics did what."""
    lines = []
    for case in dict.fromkeys(c["case"] for c in verdict.get("comparisons") or []):
        rows = [c for c in verdict["comparisons"] if c["case"] == case]
        counts = {outcome: sum(c["verdict"] == outcome for c in rows) for outcome in dict.fromkeys(
            c["verdict"] for c in rows)}
        worst = max((c for c in rows if c["verdict"] == "regressed" and c.get("change") is not None),
                    key=lambda c: abs(c["change"]), default=None)
        lines.append(Line(f"{case}: " + ", ".join(f"{n} {outcome}" for outcome, n in counts.items())
                          + (f" (the most: {worst['metric']} {change(worst['change'])})" if worst else "")))
    lines.append(Line("every comparison, its line and its causes: the verdict JSON (--trainbench-compare-json FILE) "
                      "and python -m trainbench explain"))
    return lines


def _findings(verdict: dict, judged: bool, current: str) -> Section:
    comparisons = verdict.get("comparisons") or []
    lines = _cases_not_compared(verdict, judged, current)
    for case, guard in (verdict.get("numerics") or {}).items():
        if not guard.get("ok", True):
            lines.append(Line(f"{case}: head vs base: {guard.get('message')}", NUMERICS, "warn"))
    if grouped(verdict):
        changed_cases = list(dict.fromkeys(c["case"] for c in comparisons if c.get("verdict") in ("regressed",
                                                                                               "improved")))
        lines += [_group_lines(group, changed_cases, verdict.get("environment_differs") or [])
                  for group in cause_groups(comparisons)]
        lines += _case_lines(verdict)
        comparisons = [c for c in comparisons if c.get("verdict") not in ("regressed", "improved")]
    lines += [line for line in (_finding(c, verdict, judged) for c in comparisons) if line is not None]
    one_side: dict[str, int] = {}  # a metric only one side measured (a newer metric, another device's), not failing
    for c in comparisons:
        if c.get("verdict") == "missing" and _finding(c, verdict, judged) is None:
            one_side[c["metric"]] = one_side.get(c["metric"], 0) + 1
    if one_side:
        lines.append(Line("measured by one side only: " + ", ".join(
            f"{metric} ({n} case{'s' if n > 1 else ''})" for metric, n in one_side.items()), NOT_COMPARED))
    if judged and verdict.get("could_not_judge"):
        unsure = sum(c.get("verdict") == "inconclusive" for c in comparisons)
        lines.append(Line(
            f"trainbench: {STATUS['could_not_judge']}: {unsure} timed comparison(s) stayed inconclusive after measuring "
            f"again, and nothing regressed (exit status {EXIT_COULD_NOT_JUDGE}; --trainbench-remeasure-s measures "
            "longer, --trainbench-allow-inconclusive reports them without failing)", tone="fail"))
    return Section(lines=tuple(lines))


def verdict_sections(verdict: dict, title: Section | None = None, preface: tuple[Line, ...] = (),
                     every_row: bool = False, judged: bool = True, current: str = "this session") -> list[Section]:
    """A verdict (its JSON form) as sections: the title (``title``, else the gate's decision), ``preface`` (what was
    compared with), the counts, the table (``every_row``: every comparison, else those not unchanged with the whole
    folded away), then a line per case and comparison the reader must know about. ``judged``: the gate's decision
    is shown (False: two saved runs explained, which never fail); ``current``: the newer side, as the lines name it."""
    head = [title or _title(verdict), _head(verdict, preface)]
    if grouped(verdict):  # the causes, then a line per case, in place of the table (``GROUPED_BEYOND``); Markdown
        # still folds the whole table away beneath (the terminal shows no folded table)
        return [*head, _findings(verdict, judged, current),
                Section(folded=comparison_table(verdict.get("comparisons") or []))]
    return [*head, _comparisons(verdict, every_row), _findings(verdict, judged, current)]


def verdict_markdown(verdict: dict) -> str:
    """A gate's verdict (its JSON form, as read from its file) as Markdown (a CI job summary, a PR comment)."""
    return markdown(verdict_sections(verdict))


def nothing_compared(verdict: dict) -> list[Section]:
    """A comparison that compared nothing: under a gate it fails (``Verdict.failed``), without one it is said."""
    failing = bool(verdict.get("failed"))
    return [Section(lines=(Line(f"trainbench compare vs {verdict.get('baseline')}: nothing compared: "
                                f"{verdict.get('nothing_compared')}" + ("; a gate that saw nothing never passes"
                                                                        if failing else ""),
                                FAIL if failing else "", "fail" if failing else ""),))]


def last_line(verdict: dict, exit_status: int) -> str:
    """The session's closing line, after pytest's own count of passed tests: what the gate decided, and the
    session's exit status, so a log read from its end never reads green where the gate failed."""
    said = ", ".join(f"{n} {outcome}" for outcome, n in (verdict.get("counts") or {}).items() if n)
    reasons = [said] if said else []
    if verdict.get("errors"):
        reasons.append(f"{len(verdict['errors'])} unreadable in the baseline")
    if verdict.get("nothing_compared"):
        reasons.append(f"nothing compared: {verdict['nothing_compared']}")
    if verdict.get("new_cases") and not verdict.get("new_cases_allowed"):
        reasons.append(f"{len(verdict['new_cases'])} not in the baseline")
    what = "A/B" if verdict.get("ab") is not None else "gate"
    return f"trainbench {what}: {status(verdict)}" + (f", {'; '.join(reasons)}" if reasons else "") + f" (exit {exit_status})"


# -- the session's table ----------------------------------------------------------------------------------------------

# The marks of a "vs base" cell: a ratio timed on a busy machine (no finding, whatever its size), one timed apart
# from its baseline's rounds (drift is in it), and one against another measurement of the baseline than its row's
# that the rows' ratio disagrees with by more than ROWS_DISAGREE.
DOUBTED, UNPAIRED, OTHER_BASELINE = "?", "~", "*"
ROWS_DISAGREE = 0.10

_SUMMARY_COLUMNS = (Column("case", left=True), Column("samples/s"), Column("step ms (IQR)"), Column("peak MiB"),
                   Column("act MiB"), Column("GPU pred MiB"), Column("GFLOP/sample"), Column("vs base"),
                   Column("budget"))


def summary_table(records: list[CaseRecord]) -> list[str]:
    """One line per case: throughput, step time, memory, work and the budget verdict (and items/s, e.g. tokens/s,
    where a spec counts items: a column of its own, named by their unit where every case counts the same)."""
    units = {record.raw.get("items_unit") for record in records if record.metrics.get("items_per_s") is not None}
    columns = list(_SUMMARY_COLUMNS)
    if units:
        columns.insert(2, Column(f"{units.pop()}/s" if len(units) == 1 else "items/s"))
    body = []
    for record in records:
        m = record.metrics
        row = [
            record.case,
            number(m["samples_per_s"], ".1f") + (DOUBTED if busy_reason(record.raw.get("machine_load")) else ""),
            f"{number(m['step_time_ms'], '.1f')} ({number(m['step_time_iqr_ms'], '.1f')})",
            number(m["peak_memory_mib"], ".1f"),
            number(m["activation_mib"], ".1f"),
            _predicted_cell(record),
            number(m["gflops_per_sample"], ".3f" if (m["gflops_per_sample"] or 0) >= 0.1 else ".3g"),  # small models too
            _vs_base_cell(record, records),
            record.budget_status,
        ]
        if len(columns) > len(_SUMMARY_COLUMNS):
            items = m.get("items_per_s")
            row.insert(2, number(items, ".0f") + ("" if items is None or columns[2].title != "items/s"
                                                 else f" {record.raw.get('items_unit')}"))
        body.append(tuple(row))
    return Table(tuple(columns), tuple(body)).terminal()


def _vs_base_cell(record: CaseRecord, records: list[CaseRecord]) -> str:
    """The speed-up over the case's baseline, marked ``DOUBTED`` where a busy machine timed it, ``UNPAIRED`` where its
    rounds were not interleaved with the baseline's, ``OTHER_BASELINE`` where its baseline is not the row shown."""
    speedup = record.speedup_vs_baseline
    if speedup is None:
        return MISSING
    return (number(speedup, ".2f", "x") + (DOUBTED if record.speedup_doubt else "" if record.paired else UNPAIRED)
            + (OTHER_BASELINE if other_baseline_row(record, records) else ""))


def other_baseline_row(record: CaseRecord, records: list[CaseRecord]) -> CaseRecord | None:
    """The baseline's own row in ``records`` where ``record``'s speed-up divides by another measurement of it (one
    interleaved with the case, or made for it before the baseline's own test ran) and the two rows' ratio disagrees
    with the "vs base" cell by more than ``ROWS_DISAGREE`` (a busy spell between them). None: the same measurement,
    rows that agree, no such row, or no figure recorded."""
    used, base = record.baseline_samples_per_s, record.baseline_case
    row = next((r for r in records if r.case == base), None) if base else None
    shown = row.metrics.get("samples_per_s") if row is not None else None
    return row if used is not None and shown and abs(used / shown - 1) > ROWS_DISAGREE else None


def vs_base_lines(records: list[CaseRecord]) -> list[Line]:
    """What the marks of the "vs base" column say, for those the table shows: each ratio timed on a busy machine with
    its reason, beneath one line saying it is no finding; then what an unpaired ratio carries."""
    lines = []
    busy = [(record, busy_reason(record.raw.get("machine_load"))) for record in records]
    busy = [(record, reason) for record, reason in busy if reason]
    if busy:  # its own row: a figure of a busy spell (one baseline read 164 ms a step in one run, 41.6 in the next)
        lines.append(Line("samples/s timed on a busy machine: that row's speed is of its busy spell, not of the case; "
                          "measure on a quiet machine", DOUBTED, "warn",
                          tuple(f"{record.case}: {reason}" for record, reason in busy)))
    doubted = [record for record in records if record.speedup_doubt]
    if doubted:
        lines.append(Line("vs base timed on a busy machine: no finding, whatever its size; measure on a quiet machine "
                          "(--trainbench-pair-baselines interleaves every case with its baseline)", DOUBTED, "warn",
                          tuple(f"{record.case}: {record.speedup_doubt}" for record in doubted)))
    if any(r.speedup_vs_baseline is not None and not r.paired and not r.speedup_doubt for r in records):
        lines.append(Line("vs base unpaired: the baseline's rounds were timed apart from the case's (no ratio budget "
                          "asked for interleaving), so machine drift is in the ratio", UNPAIRED))
    others = [(r, other_baseline_row(r, records)) for r in records]
    others = [(r, row) for r, row in others if row is not None]
    if others:
        lines.append(Line(f"vs base disagrees with the rows' ratio by more than {ROWS_DISAGREE:.0%}: it divides by "
                          "another measurement of the baseline than its row (interleaved with the case, or made for it "
                          "before the baseline's own test), and the machine moved between the two",
                          OTHER_BASELINE, "warn", tuple(
                              f"{r.case}: {r.speedup_vs_baseline:.2f}x against {row.case} at "
                              f"{r.baseline_samples_per_s:.1f} samples/s; its row {row.metrics['samples_per_s']:.1f} "
                              f"samples/s gives {r.metrics['samples_per_s'] / row.metrics['samples_per_s']:.2f}x"
                              for r, row in others)))
    return lines


def _predicted_cell(record: CaseRecord) -> str:
    """The GPU-profile prediction: MiB (``!`` where the method's check on this run failed), ``NOT_PREDICTED`` where it
    could not be made (the summary says why below the table), ``-`` where none was asked for."""
    if record.prediction_failure:
        return NOT_PREDICTED
    return number(record.metrics.get("predicted_gpu_peak_mib"), ".0f") + ("" if record.prediction_matches is not False
                                                                          else "!")


def costs_lines(records: list[CaseRecord], session_s: float | None = None) -> list[str]:
    """``--trainbench-costs``: each case's wall seconds by phase (``trainbench.core.harness.costs.PHASES``, its baseline's share
    added in), a row of their sums, and how much of it the timed rounds were: what the summary's figures cost."""
    costed = [r for r in records if r.phase_seconds]
    if not costed:
        return ["costs: no case recorded its phases"]
    phases = [name for name in [*PHASES, OTHER] if any(by_phase(r.phase_seconds)[name] >= 0.005 for r in costed)]
    columns = (Column("case", left=True), Column("total s"), Column("rounds"), *(Column(name) for name in phases))
    sums = dict.fromkeys([TOTAL, *phases], 0.0)
    rows = []
    for record in costed:
        seconds = {**by_phase(record.phase_seconds), TOTAL: record.phase_seconds.get(TOTAL, 0.0)}
        for name in sums:
            sums[name] += seconds[name]
        rows.append((record.case, *_cost_cells(seconds, timed_rounds_s(record.phase_seconds), phases)))
    rounds = sum(timed_rounds_s(r.phase_seconds) for r in costed)
    rows.append(("all cases", *_cost_cells(sums, rounds, phases)))
    top = sorted(((sums[name], name) for name in phases if name != "rounds"), reverse=True)[:3]
    wall = session_s if session_s else sums[TOTAL]
    lines = Table(columns, tuple(rows)).terminal()
    lines.append(f"timed rounds: {rounds:.1f} s of {wall:.1f} s " + ("of the session" if session_s else "of the cases")
                 + f" ({rounds / wall:.0%}); the most beside them: "
                 + ", ".join(f"{name} {seconds:.1f} s" for seconds, name in top))
    return lines


def _cost_cells(seconds: dict[str, float], rounds_s: float, phases: list[str]) -> tuple[str, ...]:
    total = seconds[TOTAL]
    return (f"{total:.1f}", f"{rounds_s / total:.0%}" if total else "-", *(f"{seconds[name]:.1f}" for name in phases))
