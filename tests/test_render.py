"""Numbers and tables as printed in the terminal and in Markdown."""

import pytest

from trainbench.verdicts.render import Column, Table, change, interval, number

TABLE = Table((Column("case", left=True), Column("samples/s"), Column("note", left=True)),
              (("mlp-baseline", number(1234.5678, ".1f"), "ok"), ("resnet18-amp_bf16", number(None), "a|b")))


def test_a_number_has_its_format_and_a_missing_one_a_dash():
    assert number(1234.5678) == "1235" and number(0.000123456) == "0.0001235"
    assert number(2.5, ".2f", "x") == "2.50x" and number(None, ".2f", "x") == "-"
    assert change(-0.2) == "-20.0%" and change(None) == "-"
    assert interval((0.9, 1.05)) == "-10.0%..+5.0%" and interval(None) == "-"


def test_the_terminal_table_sizes_columns_to_their_widest_cell_and_aligns_figures_right():
    header, rule, first, second = TABLE.terminal()
    assert header == "case               samples/s  note"
    assert rule == "-----------------  ---------  ----"
    assert first == "mlp-baseline          1234.6  ok  "
    assert second == "resnet18-amp_bf16          -  a|b "


def test_the_markdown_table_aligns_figures_escapes_pipes_and_marks_missing_values():
    header, align, first, second = TABLE.markdown()
    assert header == "| case | samples/s | note |" and align == "|---|---:|---|"
    assert first == "| mlp-baseline | 1234.6 | ok |"
    assert second == "| resnet18-amp_bf16 | — | a\\|b |"


def test_a_row_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match="a row of 1 cells in a table of 2 columns"):
        Table((Column("a"), Column("b")), (("x",),))


# -- the GPU prediction column and its legend -------------------------------------------------------------------------

def _predicted_record(case: str, predicted: dict | None):
    from trainbench.core.records.result import CaseRecord

    peak = (predicted or {}).get("breakdown_bytes", {}).get("total")
    return CaseRecord.read({"case": case, "samples_per_step": 16, "samples_per_s": 100.0, "step_time_ms": 160.0,
                            "round_step_times_s": [0.16], "predicted_gpu_peak_mib": peak / 2**20 if peak else None,
                            "predicted_memory": predicted}, case)


PREDICTED = {"profile": "gpu", "device": "cpu", "batch_size": 32, "breakdown_bytes": {"total": 300 * 2**20}}
EXACT = {"check": {"matches": True}}
FAILED = {"profile": "gpu", "reason": "FakeTensorMode could not run the step: TypeError: Multiple dispatch failed"}


def test_a_prediction_that_could_not_be_made_is_marked_in_its_cell_and_explained_below_the_table():
    from trainbench.plugin.summary import _prediction_lines
    from trainbench.verdicts.present import summary_table

    records = [_predicted_record("a-baseline", {**PREDICTED, **EXACT}), _predicted_record("b-baseline", FAILED),
               _predicted_record("b-amp", FAILED), _predicted_record("c-baseline", None)]
    cells = [row.split()[6] for row in summary_table(records)[2:]]
    assert cells == ["300", "n/a", "n/a", "-"]  # predicted, could not be, not asked for
    lines = _prediction_lines(records)
    assert lines[0] == ("GPU pred: the GPU profile's tracked tensor peak predicted under FakeTensorMode (no allocator "
                        "cache, workspaces or CUDA context); each case's own setup predicted exactly as measured", False)
    assert lines[1:] == [(f"GPU pred n/a for b-baseline, b-amp: {FAILED['reason']}", True)]  # one line per reason


def test_the_prediction_legend_claims_exactness_only_for_the_cases_it_checked():
    from trainbench.plugin.summary import _prediction_lines

    unchecked = [_predicted_record("a", {**PREDICTED, **EXACT}), _predicted_record("b", PREDICTED)]
    assert _prediction_lines(unchecked)[0][0].endswith(
        "; own setup predicted exactly as measured for 1 of 2 cases, the others not checked (their own setup not "
        "predicted or its breakdown not measured)")
    mismatched = [_predicted_record("a", {**PREDICTED, **EXACT}), _predicted_record("b", {**PREDICTED, "check": {
        "matches": False}})]
    assert _prediction_lines(mismatched) == [
        ("GPU pred: the GPU profile's tracked tensor peak predicted under FakeTensorMode (no allocator cache, "
         "workspaces or CUDA context); 1 of 2 cases' own setup predicted exactly as measured", False),
        ("GPU pred !: the prediction of this run's own setup differs from its measured breakdown (the method's check "
         "failed): b", True)]
    # Nothing predicted at all: no legend, only the reasons.
    assert _prediction_lines([_predicted_record("b", FAILED)]) == [(f"GPU pred n/a for b: {FAILED['reason']}", True)]
    assert _prediction_lines([_predicted_record("c", None)]) == []


def _speedup_record(case: str, samples_per_s: float, speedup: float | None = None, base_used: float | None = None,
                    paired: bool = True):
    from trainbench.core.records.result import CaseRecord

    workload, recipe = case.split("-", 1)
    info = {"case": case, "workload": workload, "recipe": recipe, "samples_per_step": 16,
            "samples_per_s": samples_per_s, "step_time_ms": 16000 / samples_per_s,
            "round_step_times_s": [16 / samples_per_s], "paired": paired}
    if speedup is not None:
        info.update(baseline="baseline", speedup_vs_baseline=speedup, baseline_samples_per_s=base_used)
    return CaseRecord.read(info, case)


def test_a_speed_up_against_another_baseline_measurement_than_its_row_is_marked_where_the_rows_disagree():
    """The case's ratio divides by the baseline measured for it (interleaved, or before the baseline's own test);
    the baseline's own row came from another measurement, on a busy spell: the cell read 0.86x, the rows 2.17x."""
    from trainbench.verdicts.present import summary_table, vs_base_lines

    busy_row = _speedup_record("mlp-baseline", 46.1)
    case = _speedup_record("mlp-larger_batch", 100.0, speedup=0.86, base_used=116.3)
    agreeing = _speedup_record("mlp-amp", 48.0, speedup=1.0, base_used=48.0)  # 4% from the row's: not marked
    cells = {row.split()[0]: row.split()[8] for row in summary_table([busy_row, case, agreeing])[2:]}
    assert cells == {"mlp-baseline": "-", "mlp-larger_batch": "0.86x*", "mlp-amp": "1.00x"}
    line = next(line for line in vs_base_lines([busy_row, case, agreeing]) if line.label == "*")
    assert line.under == ("mlp-larger_batch: 0.86x against mlp-baseline at 116.3 samples/s; its row 46.1 samples/s "
                          "gives 2.17x",)
    assert not [line for line in vs_base_lines([busy_row, agreeing]) if line.label == "*"]


def test_a_row_timed_on_a_busy_machine_is_marked_and_said_beneath_the_table():
    """Under load one baseline read 164 ms a step in one run and 41.6 ms in the next: its row is its busy spell's."""
    from trainbench.core.records.result import CaseRecord
    from trainbench.verdicts.present import summary_table, vs_base_lines

    def record(case, other_cpus):
        return CaseRecord.read({"case": case, "samples_per_step": 16, "samples_per_s": 100.0, "step_time_ms": 160.0,
                                "round_step_times_s": [0.16], "machine_load": {"cpus": 2, "other_cpus": other_cpus}},
                               case)

    records = [record("mlp-baseline", 1.6), record("mlp-amp", 0.0)]
    cells = {row.split()[0]: row.split()[1] for row in summary_table(records)[2:]}
    assert cells == {"mlp-baseline": "100.0?", "mlp-amp": "100.0"}
    [line] = [line for line in vs_base_lines(records) if line.text.startswith("samples/s timed on a busy machine")]
    assert line.under == ("mlp-baseline: busy machine: other processes used 1.60 of 2 CPUs while it ran",)
