"""A verdict is built into sections once and reads the same in the terminal and in Markdown."""

import re

import pytest

from trainbench.verdicts.gate import OUTCOMES, MetricComparison, Verdict
from trainbench.verdicts.present import (
    FINDING,
    STATUS,
    Line,
    Section,
    last_line,
    markdown,
    nothing_compared,
    terminal,
    terminal_lines,
    verdict_sections,
)
from trainbench.verdicts.render import Column, Table


def comparison(outcome: str, case: str = "mlp-baseline", metric: str = "samples_per_s") -> MetricComparison:
    return MetricComparison(case, metric, 100.0, None if outcome == "missing" else 80.0,
                            None if outcome == "missing" else -0.2, 0.05, outcome, 0.01, (0.75, 0.85),
                            "busy machine" if outcome == "inconclusive" else None,
                            ("op self time: aten::mm +1 ms/step",) if outcome in ("regressed", "improved") else ())


def every_outcome(**options) -> dict:
    """A verdict with a comparison of each outcome, a new case, an unreadable and a skipped baseline case."""
    comparisons = tuple(comparison(outcome, f"case-{outcome}") for outcome in OUTCOMES)
    return Verdict("base.json", {"name": "cpu"}, comparisons, new_cases=("gelu_mlp-new",), errors=("base.json: broken",),
                   not_run=("mlp-skipped",), environment=("torch 2.14.1 there, 2.15.0 here",),
                   not_measured=("kernel_time_ms",), **options).to_json()


VERDICTS = {
    "gated": every_outcome(gated=True),
    "allowing inconclusive and new cases": every_outcome(gated=True, allow_inconclusive=True, new_cases_allowed=True),
    "not gated": every_outcome(gated=False),
    "could not judge": Verdict("base.json", {}, (comparison("inconclusive"), comparison("unchanged", metric="mfu")),
                               gated=True).to_json(),
}


def _markdown_said(text: str) -> list[str]:
    """The Markdown's title and list items as plain text: no heading marks, bold, code or list marks."""
    said = []
    for line in text.splitlines():
        if line.startswith("### "):
            said.append(line[4:].replace("`", ""))
        elif line.startswith(("- ", "  - ")):
            said.append(line.removeprefix("  - ").removeprefix("- ").replace("**", ""))
    return said


def _terminal_said(sections) -> list[str]:
    """The terminal's lines outside its tables, under-lines unindented."""
    tables = {text for s in sections if s.table is not None for text in s.table.terminal()} | {
        s.empty for s in sections if s.table is not None}
    return [text.removeprefix("    ") for text, _, _ in terminal(sections) if text not in tables]


@pytest.mark.parametrize("name", sorted(VERDICTS))
@pytest.mark.parametrize("every_row", [False, True])
def test_the_terminal_and_the_markdown_of_a_verdict_say_the_same(name, every_row):
    sections = verdict_sections(VERDICTS[name], every_row=every_row)
    assert _terminal_said(sections) == _markdown_said(markdown(sections))


@pytest.mark.parametrize("name", sorted(VERDICTS))
def test_every_outcome_reads_with_the_same_words_in_both(name):
    # outside the tables (both renderings lay out the same Table), each outcome's words, as often in each
    sections = verdict_sections(VERDICTS[name])
    text, md = "\n".join(_terminal_said(sections)), markdown(sections)
    said_in_markdown = "\n".join(_markdown_said(md))
    words = [*STATUS.values(), *(word for pair in FINDING.values() for word in pair), *OUTCOMES]
    for word in words:
        pattern = rf"(?<![\w-]){re.escape(word)}(?![\w-])"
        assert len(re.findall(pattern, text)) == len(re.findall(pattern, said_in_markdown)), word
    if VERDICTS[name]["not_run"]:  # the outcome that read differently in each
        assert "not compared: 1 case(s) of the baseline run did not run in this session: mlp-skipped" in text
        assert "- **not compared:** 1 case(s) of the baseline run did not run in this session: mlp-skipped" in md


def test_each_outcome_leads_its_line_by_whether_it_fails_the_gate():
    said = terminal_lines(verdict_sections(VERDICTS["gated"]))
    assert "REGRESSION case-regressed samples_per_s: 100 -> 80 samples/s" in "\n".join(said)
    assert any(line.startswith("INCONCLUSIVE (fails the gate) case-inconclusive") for line in said)
    assert any(line.startswith("IMPROVED case-improved") for line in said)
    assert any(line.startswith("FAIL case-missing") for line in said)
    assert any(line.startswith("FAIL gelu_mlp-new: not in the baseline run") for line in said)
    assert said[0] == "trainbench compare vs base.json: gate FAILED"
    allowed = terminal_lines(verdict_sections(VERDICTS["allowing inconclusive and new cases"]))
    assert any(line.startswith("INCONCLUSIVE case-inconclusive") for line in allowed)
    assert "not compared: 1 case(s) of this session not in the baseline run: gelu_mlp-new" in allowed
    ungated = terminal_lines(verdict_sections(VERDICTS["not gated"]))
    assert any(line.startswith("regressed (not gated): case-regressed") for line in ungated)
    assert "not compared: measured by one side only: samples_per_s (1 case)" in ungated
    assert ungated[0] == "trainbench compare vs base.json: no gate (--trainbench-compare-fail not given)"


def test_a_verdict_that_could_not_judge_says_so_in_its_title_its_lines_and_its_last_line():
    verdict = VERDICTS["could not judge"]
    md = markdown(verdict_sections(verdict))
    assert md.startswith("### trainbench compare vs `base.json`: gate COULD NOT JUDGE\n")
    assert "- trainbench: COULD NOT JUDGE: 1 timed comparison(s) stayed inconclusive" in md
    assert last_line(verdict, 6) == "trainbench gate: COULD NOT JUDGE, 1 inconclusive, 1 unchanged (exit 6)"


def test_a_comparison_of_nothing_fails_only_under_a_gate():
    gated = Verdict("base.json", {}, (), gated=True, nothing_compared="every case skipped").to_json()
    assert terminal(nothing_compared(gated)) == [("FAIL trainbench compare vs base.json: nothing compared: every case "
                                                  "skipped; a gate that saw nothing never passes", {"red": True}, False)]
    ungated = Verdict("base.json", {}, (), gated=False, nothing_compared="every case skipped").to_json()
    assert terminal_lines(nothing_compared(ungated)) == ["trainbench compare vs base.json: nothing compared: every "
                                                          "case skipped"]


def test_sections_lay_out_as_lines_titles_and_tables():
    table = Table((Column("case", left=True), Column("ms")), (("a|b", "1"),))
    sections = [Section("explain {} vs {}", ("x", "y"), (Line("slower", "REGRESSION", "fail", ("op",)),), table)]
    assert terminal(sections) == [("explain x vs y", {}, True), ("REGRESSION slower", {"red": True}, False),
                                  ("    op", {}, False), ("case  ms", {}, False), ("----  --", {}, False),
                                  ("a|b    1", {}, False)]
    assert markdown(sections) == ("### explain `x` vs `y`\n\n- **REGRESSION** slower\n  - op\n\n| case | ms |\n"
                                  "|---|---:|\n| a\\|b | 1 |\n")


def test_changes_are_grouped_by_the_op_module_or_site_that_explains_the_most_of_them():
    from trainbench.verdicts.present import cause_groups

    def changed(case, metric, *causes):
        return {"case": case, "metric": metric, "verdict": "regressed", "change": 0.5,
                "causes": [{"table": table, "row": row, "change": 1.0, "share": share} for table, row, share in causes]}

    layer = [changed(case, "param_mib", ("memory.param_bytes", "Net.block", 1.0)) for case in ("a", "b")]
    ops = changed("a", "ops_per_step", ("ops", "aten.mm", 0.6), ("ops_by_site", "Net.block (backward)", 0.4))
    calls = changed("a", "aten_calls_per_step", ("time.calls", "(other)", 0.9))  # an aggregate names nothing
    flops = changed("a", "gflops_per_sample", ("flops", "aten::addmm", 1.0))
    groups = cause_groups([*layer, ops, calls, flops, {**changed("b", "predicted_gpu_peak_mib"), "causes": []}])
    assert [(g.cause and g.cause["row"], [c["metric"] for c in g.comparisons]) for g in groups] == [
        ("Net.block", ["param_mib", "param_mib", "ops_per_step"]),  # its backward is the module too
        ("aten::addmm", ["gflops_per_sample"]),
        (None, ["aten_calls_per_step", "predicted_gpu_peak_mib"])]
