"""One verdict for the gate and A/B: when it fails, its JSON, its table and its Markdown."""

import json

import pytest

from trainbench.ab import ABOutcome
from trainbench.ab import verdict as ab_verdict
from trainbench.gate import MetricComparison, Verdict, verdict_markdown, verdict_table

# The keys --trainbench-compare-json has always written; CI jobs and `python -m trainbench verdict` read them.
GATE_KEYS = ["baseline", "device", "counts", "failed", "comparisons", "gated", "new_cases", "new_cases_allowed",
             "errors", "strict"]
COMPARISON_KEYS = {"case", "metric", "baseline", "current", "change", "threshold", "verdict", "p_value", "ci",
                   "reason", "unit", "line"}


def comparison(verdict: str, metric: str = "samples_per_s", change: float | None = -0.2) -> MetricComparison:
    ci = (0.75, 0.85) if metric == "samples_per_s" and change is not None else None
    return MetricComparison("mlp-baseline", metric, 100.0, None if change is None else 100.0 * (1 + change), change,
                            0.05, verdict, 0.01 if ci else None, ci, "busy machine" if verdict == "inconclusive" else None)


def verdict(*outcomes: str, **options) -> Verdict:
    return Verdict("base.json", {"name": "cpu"}, tuple(comparison(v) for v in outcomes), **options)


@pytest.mark.parametrize(("outcomes", "options", "failed"), [
    (["unchanged", "improved"], {"gated": True}, False),
    (["regressed"], {"gated": True}, True),
    (["regressed"], {"gated": False}, False),  # shown, not gated
    (["missing"], {"gated": True}, True),  # nothing compared: a gate fails closed
    (["inconclusive"], {"gated": True}, False),
    (["inconclusive"], {"gated": True, "strict": True}, True),
    (["inconclusive"], {"gated": False, "strict": True}, False),
    ([], {"gated": True, "new_cases": ("new-case",)}, True),
    ([], {"gated": True, "new_cases": ("new-case",), "new_cases_allowed": True}, False),
    ([], {"gated": False, "errors": ("base.json: unreadable",)}, True),  # an unreadable baseline fails ungated too
])
def test_one_rule_decides_failure(outcomes, options, failed):
    assert verdict(*outcomes, **options).failed is failed


def test_the_json_keeps_its_keys_and_counts_every_outcome():
    data = verdict("regressed", "unchanged", "unchanged", gated=True).to_json()
    assert list(data) == GATE_KEYS
    assert data["counts"] == {"regressed": 1, "inconclusive": 0, "improved": 0, "unchanged": 2, "missing": 0}
    assert data["failed"] and set(data["comparisons"][0]) == COMPARISON_KEYS
    assert data["comparisons"][0]["ci"] == [0.75, 0.85] and data["comparisons"][0]["unit"] == "samples/s"
    assert json.loads(json.dumps(data)) == data


def _ab_outcome(*outcomes: str) -> ABOutcome:
    return ABOutcome("mlp-baseline", None, None, [(0.01, 0.012)] * 3, [comparison(v) for v in outcomes])


IDENTITIES = {label: {"python": f"/{label}/python", "trainbench": "0.1.0", "identity": {"name": "cpu"}}
              for label in ("base", "head")}


def test_an_ab_verdict_is_the_gates_with_both_environments():
    data = ab_verdict([_ab_outcome("unchanged")], IDENTITIES, gated=True).to_json()
    assert list(data) == GATE_KEYS[:5] + ["ab", "pairs", "numerics"] + GATE_KEYS[5:]
    assert data["baseline"] == "A/B: base vs head" and set(data["ab"]) == {"base", "head"}
    assert data["pairs"] == {"mlp-baseline": [(0.01, 0.012)] * 3} and not data["failed"]


def test_strict_timing_fails_an_inconclusive_ab_run_as_it_fails_a_gate():
    lenient = ab_verdict([_ab_outcome("inconclusive")], IDENTITIES, gated=True)
    strict = ab_verdict([_ab_outcome("inconclusive")], IDENTITIES, gated=True, strict=True)
    assert not lenient.failed and strict.failed and strict.to_json()["strict"]
    assert ab_verdict([_ab_outcome("missing")], IDENTITIES, gated=True).failed


def test_a_comparison_reads_as_one_line_and_one_table_row():
    regressed, exact = comparison("regressed"), comparison("unchanged", "activation_mib", 0.0)
    assert regressed.describe() == ("mlp-baseline samples_per_s: 100 -> 80 samples/s (-20.0%, 95% CI -25.0%..-15.0%, "
                                    "p=0.01) regressed (threshold 5.0%)")
    assert comparison("missing", change=None).describe().endswith("not measured in this run (baseline 100, now -): "
                                                                  "nothing to compare")
    header, _, first, second = verdict_table([regressed, exact])
    assert header.split() == ["case", "metric", "baseline", "current", "change", "95%", "CI", "verdict"]
    assert first.split() == ["mlp-baseline", "samples_per_s", "100", "80", "-20.0%", "-25.0%..-15.0%", "regressed"]
    assert second.split() == ["mlp-baseline", "activation_mib", "100", "100", "+0.0%", "-", "unchanged"]


def test_the_markdown_lists_what_changed_and_folds_the_rest():
    data = Verdict("base.json", {}, (comparison("regressed"), comparison("unchanged", "activation_mib", 0.0)),
                   gated=True, new_cases=("gelu_mlp-baseline",)).to_json()
    text = verdict_markdown(data)
    assert text.startswith("### trainbench gate FAILED: vs `base.json`\n\n1 regressed, 1 unchanged\n")
    assert "- **FAIL** gelu_mlp-baseline: not in the baseline run" in text
    notable, folded = text.split("<details>")
    assert "| mlp-baseline | samples_per_s | 100 | 80 | -20.0% | -25.0%..-15.0% | regressed |" in notable
    assert "| mlp-baseline | activation_mib | 100 | 100 | +0.0% | — | unchanged |" in folded
    assert "activation_mib" not in notable
