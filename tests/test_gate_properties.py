"""Property tests of the gate: every single corruption of a saved baseline run either compares correctly or fails
closed with one line naming the file and the case; a gated metric of this run is never left unchecked on a pass.

The baseline is a pytest-benchmark run of two trainbench cases, written as pytest-benchmark writes it. The gate
has a 0% threshold on every deterministic metric and a 50% one on samples/s, a timed metric judged over the
rounds: one case unchanged, the other three times faster than a baseline measured on a busy machine (an
improvement the busy machine leaves unproven), so both the value path and the rounds path run, and the baseline's
machine load is read. The gate runs with inconclusive verdicts allowed, its most lenient setting: whatever passes
there passes everywhere. Timed verdicts are not pinned here (their rule is the gate's own): only that one was
computed over the rounds, or the gate said it could not judge.
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Iterator

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trainbench.core.records.metrics import METRICS, is_timed, parse_thresholds
from trainbench.core.records.result import MIB, CaseRecord, MeasuredCase, Result, case_record
from trainbench.verdicts.compare import EXACT, compare_with_baseline
from trainbench.verdicts.gate import OUTCOMES, Verdict
from trainbench.verdicts.store import RunFileError, SavedRun, load_run

THRESHOLDS = parse_thresholds("deterministic:0%,samples_per_s:50%")
ROUNDS_MS = (10.0, 10.2, 9.9, 10.1, 10.0, 10.3, 9.8)
QUIET = {"cpus": 2, "seconds": 1.2, "other_cpus": 0.01, "load_average_1m": [0.2, 0.3]}
BUSY = {"cpus": 2, "seconds": 1.2, "other_cpus": 1.1, "load_average_1m": [3.9, 4.1]}
# What a corruption may put in place of any value: non-finite numbers, null, and each other JSON type.
CORRUPT_VALUES = (math.nan, math.inf, -math.inf, None, "", "x", [], [1.5], {}, {"x": 1}, True)
DROP = "drop"
PROPERTY_SETTINGS = settings(max_examples=600, deadline=None, derandomize=True, database=None)


def _result(case: str, step_ms, load: dict) -> Result:
    return Result(
        case=case, workload="mlp", recipe=case.split("-")[1], profile="cpu", batch_size=16,
        config={"batch_size": None, "seed": 0}, device={"kind": "cpu", "name": "CPU A", "cpu_capability": "AVX512"},
        rounds=len(step_ms), steps_per_round=3, round_step_times_s=[t / 1e3 for t in step_ms], data_wait_s=0.001,
        warmup_steps=4, warmup_steady=True, warmup_s=0.1, first_step_s=0.05,
        memory_breakdown_bytes={"total": 3 * MIB, "params": MIB, "grads": MIB, "activations": MIB // 2,
                                "temporaries": 0, "optimizer_state": MIB // 2},
        predicted_memory={"profile": "gpu", "breakdown_bytes": {"total": 5 * MIB, "activations": 2 * MIB}},
        memory_growth_bytes_per_step=0.0, graph_nodes_growth_per_step=0.0, flops_per_step=16 * 10**6,
        ops_per_step=120, syncs_per_step=0, h2d_bytes_per_sample=0.0, aten_calls_per_step=310,
        attribution={"ops": {"aten.mm": 6.0}}, final_loss=2.3, notes=["µ-batches of 4"], machine_load=load,
        phase_seconds={"memory": 0.2})


def _record(result: Result) -> dict:
    budget = {"status": "pass", "device_key": "cpu", "file": "budgets.toml", "checks": [
        {"key": "max_activation_mib", "measured": 0.5, "limit": 1.0, "ok": True,
         "message": "activation_mib: measured 0.5 MiB vs budget <= 1 MiB", "inconclusive": None}]}
    return case_record(result, baseline=None, speedup_vs_baseline=None, paired=False, budget=budget)


def _bench(record: dict) -> dict:
    """A benchmark entry as pytest-benchmark saves it, ``record`` as its extra_info."""
    name = f"test_recipes[{record['case']}]"
    rounds = record["round_step_times_s"]
    return {"group": None, "name": name, "fullname": f"benchmarks/test_recipes.py::{name}",
            "params": {"case": record["case"]}, "param": record["case"], "extra_info": record,
            "options": {"disable_gc": False, "timer": "perf_counter", "min_rounds": len(rounds), "warmup": False},
            "stats": {"min": min(rounds), "max": max(rounds), "mean": sum(rounds) / len(rounds), "stddev": 0.0,
                      "rounds": len(rounds), "median": sorted(rounds)[len(rounds) // 2], "iterations": 3}}


FASTER = tuple(t / 3 for t in ROUNDS_MS)
BASELINE_RUN = {"machine_info": {"trainbench": {"kind": "cpu", "name": "CPU A", "cpu_capability": "AVX512"}},
                "commit_info": {"id": "abc"}, "datetime": "2026-11-25T00:00:00", "version": "5.1.0",
                "benchmarks": [_bench(_record(_result("mlp-baseline", ROUNDS_MS, QUIET))),
                               _bench(_record(_result("mlp-amp", ROUNDS_MS, BUSY)))]}
# This session: the first case as the baseline measured it, the second three times faster on a quiet machine.
CURRENT = [MeasuredCase(CaseRecord.read(_record(result), result.case), bench["fullname"], {})
           for result, bench in zip((_result("mlp-baseline", ROUNDS_MS, QUIET), _result("mlp-amp", FASTER, QUIET)),
                                    BASELINE_RUN["benchmarks"])]


def _save(run: dict, path) -> None:
    """As pytest-benchmark writes a run (NaN and Infinity as bare tokens), with a non-ASCII character kept."""
    path.write_text(json.dumps(run, indent=4, ensure_ascii=False), encoding="utf-8")


def _gate_saved(path) -> Verdict:
    """Load the saved run and gate this session against it, as the plugin does: pytest-benchmark maps each
    benchmark's fullname to the entry (the last of duplicates), and the gate reads the entries it needs."""
    run = load_run(path)
    return compare_with_baseline(CURRENT, {bench["fullname"]: bench for bench in run["benchmarks"]}, str(path), {}, THRESHOLDS,
                allow_inconclusive=True)


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    return tmp_path_factory.mktemp("runs") / "0001_baseline.json"


@pytest.fixture(scope="module")
def reference(run_file) -> Verdict:
    _save(BASELINE_RUN, run_file)
    return _gate_saved(run_file)


def test_the_uncorrupted_baseline_passes_through_both_the_value_and_the_rounds_path(reference):
    assert not reference.failed and not reference.errors and not reference.new_cases
    verdicts = {(c.case, c.metric): c.verdict for c in reference.comparisons}
    assert verdicts[("mlp-baseline", "samples_per_s")] == "unchanged"
    assert verdicts[("mlp-amp", "ops_per_step")] == "unchanged"
    timed = [c for c in reference.comparisons if c.metric == "samples_per_s"]
    assert len(timed) == 2 and all(c.ci is not None for c in timed)  # both judged over their rounds
    assert "busy machine: other processes used 1.10 of 2 CPUs" in timed[1].reason  # the baseline's load was read


# -- property 1: a truncated file --------------------------------------------------------------------------

def test_a_run_truncated_at_any_byte_loads_whole_or_is_one_line_naming_the_file(run_file):
    """Every byte, not a sample: a cut inside a multi-byte character included."""
    _save(BASELINE_RUN, run_file)
    data = run_file.read_bytes()
    cut_file = run_file.with_name("0002_cut.json")
    cut_file.write_bytes(data)
    for cut in range(len(data), -1, -1):
        os.truncate(cut_file, cut)  # shortening one file: rewriting one per cut is disk-bound
        try:
            run = load_run(cut_file)
        except RunFileError as e:
            message = str(e)
            assert message.startswith(f"{cut_file}: ") and "\n" not in message, (cut, message)
            assert data[:cut].strip() != data.strip(), cut  # only a run that lost some of its JSON is refused
            continue
        assert data[cut:].strip() == b"" and run == BASELINE_RUN, cut


# -- property 2: any single corruption of a record ---------------------------------------------------------

def _paths(value, prefix: tuple = ()) -> Iterator[tuple]:
    """Every key and list index at any depth of ``value``."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield (*prefix, key)
        yield from _paths(child, (*prefix, key))


# (benchmark index, path from the benchmark entry): extra_info itself and everything in it.
TARGETS = [(i, ("extra_info", *path)) for i, bench in enumerate(BASELINE_RUN["benchmarks"])
           for path in [()] + list(_paths(bench["extra_info"]))]


def _get(value, path: tuple):
    for key in path:
        value = value[key]
    return value


def _kind(value) -> str:
    return "null" if value is None else "bool" if isinstance(value, bool) else \
        "number" if isinstance(value, (int, float)) else type(value).__name__


def _injected(old, new) -> bool:
    """A value no trainbench record holds there: a non-finite number, or another JSON type than it had."""
    return (isinstance(new, float) and not math.isfinite(new)) or _kind(new) != _kind(old)


def _corrupt(run: dict, index: int, path: tuple, new) -> dict:
    run = copy.deepcopy(run)
    parent = _get(run["benchmarks"][index], path[:-1])
    if new is DROP:
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return run


def _number(value) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _positive_rounds(info: dict) -> int:
    rounds = info.get("round_step_times_s")
    return sum(_number(t) is not None and t > 0 for t in rounds) if isinstance(rounds, list) else 0


def _expected_exact(metric: str, base: float | None, cur: float | None) -> str:
    """The verdict of a 0% threshold: equal values are unchanged, any other is better or worse."""
    if base is None or cur is None:
        return "missing"
    if math.isclose(cur, base, rel_tol=EXACT):
        return "unchanged"
    return "improved" if (cur > base) == METRICS[metric].higher_is_better else "regressed"


def _check_compared(verdict: Verdict, measured: MeasuredCase, info: dict) -> None:
    """Every gated metric either side holds has one comparison, of the values the saved record holds; a
    deterministic verdict is exact, a timed one was judged over the rounds or could not be judged."""
    current = measured.record
    comparisons = {c.metric: c for c in verdict.comparisons if c.case == current.case}
    expected = {m for m in THRESHOLDS if current.metrics.get(m) is not None or _number(info.get(m)) is not None}
    assert set(comparisons) == expected and \
        len([c for c in verdict.comparisons if c.case == current.case]) == len(expected)
    for metric, c in comparisons.items():
        base = info.get(metric)
        assert c.baseline == base and c.current == current.metrics.get(metric), metric
        assert "\n" not in c.describe() and c.describe().startswith(f"{current.case} {metric}: ")
        if not is_timed(metric):
            assert c.verdict == _expected_exact(metric, base, current.metrics.get(metric)), metric
        elif base is None:
            assert c.verdict == "missing"
        else:
            # judged over the rounds it was measured in, or the gate says it could not judge (too few of them)
            assert c.verdict in OUTCOMES and c.verdict != "missing", metric
            assert c.ci is not None or (c.verdict == "inconclusive" and _positive_rounds(info) > 0), (metric, c)


def _check(verdict: Verdict, reference: Verdict, run: dict, path, corrupted: dict[str, bool]) -> None:
    """``corrupted``: fullname -> whether the corruption of that case put in a value no record holds there.

    Each case either fails closed (an error naming the file and the case, or a failing comparison) or is compared
    correctly; an untouched case, and a case given a foreign value, compare exactly as before the corruption."""
    assert all("\n" not in e and e.startswith(f"{path}: ") for e in verdict.errors), verdict.errors
    mapping = {bench["fullname"]: bench for bench in run["benchmarks"]}
    for measured in CURRENT:
        case = measured.record.case
        own = [c for c in verdict.comparisons if c.case == case]
        before = [c for c in reference.comparisons if c.case == case]
        if any(e.startswith(f"{path}: {measured.fullname}: ") for e in verdict.errors):
            assert measured.fullname in corrupted and verdict.failed and not own
        elif measured.fullname not in corrupted or corrupted[measured.fullname]:
            assert own == before, (case, own, before)
        else:
            _check_compared(verdict, measured, mapping[measured.fullname]["extra_info"])
    if not verdict.failed:  # never green with a gated metric of this run unchecked
        for measured in CURRENT:
            gated = {m for m in THRESHOLDS if measured.record.metrics.get(m) is not None}
            assert gated <= {c.metric for c in verdict.comparisons if c.case == measured.record.case}


@PROPERTY_SETTINGS
@given(target=st.sampled_from(TARGETS), new=st.sampled_from((DROP, *CORRUPT_VALUES)))
# what this property found (a sample of 600 in ~2,500 corruptions need not draw them): a record without its rounds
# was judged as a bare value, and a NaN machine load passed for a busy machine
@example(target=(0, ("extra_info", "round_step_times_s")), new=DROP)
@example(target=(1, ("extra_info", "machine_load", "other_cpus")), new=math.nan)
def test_any_single_corruption_of_a_record_compares_correctly_or_fails_closed(run_file, reference, target, new):
    index, path = target
    run = _corrupt(BASELINE_RUN, index, path, new)
    _save(run, run_file)
    try:
        verdict = _gate_saved(run_file)
        refused = _start_up_check(run_file)
    finally:
        _save(BASELINE_RUN, run_file)
    old = _get(BASELINE_RUN["benchmarks"][index], path)
    injected = new is not DROP and new is not None and _injected(old, new)
    _check(verdict, reference, run, run_file, {BASELINE_RUN["benchmarks"][index]["fullname"]: injected})
    # the start-up check reads the whole run: what it lets through, the gate reads without an error, but for a record
    # turned into a plain benchmark's ({}: as a plain test beside trainbench's cases has), which only the gate, knowing
    # the case it measured under that name, can tell
    info = run["benchmarks"][index].get("extra_info")
    plain = isinstance(info, dict) and not {"case", "samples_per_step", "round_step_times_s"} & set(info)
    assert refused is not None or not verdict.errors or (plain and all("not a trainbench case" in e for e in
                                                                        verdict.errors)), verdict.errors
    if refused is not None:
        name = BASELINE_RUN["benchmarks"][index]["fullname"]
        assert "\n" not in refused and refused.startswith((f"{run_file}: {name}: ", f"{run_file}: machine_info")), refused


def _start_up_check(path) -> str | None:
    """What the session's baseline check (``SavedRun.check``) says of the run at ``path``: None where it passes."""
    try:
        SavedRun.load(path).check()
    except RunFileError as e:
        return str(e)
    return None


@PROPERTY_SETTINGS
@given(order=st.permutations(range(len(BASELINE_RUN["benchmarks"]))),
       duplicate=st.one_of(st.none(), st.integers(0, len(BASELINE_RUN["benchmarks"]) - 1)))
def test_a_reordered_run_compares_as_the_run_did_and_a_duplicated_case_is_refused_naming_both(run_file, reference, order,
                                                                                              duplicate):
    run = copy.deepcopy(BASELINE_RUN)
    run["benchmarks"] = [run["benchmarks"][i] for i in order]
    if duplicate is not None:
        run["benchmarks"].insert(duplicate, copy.deepcopy(run["benchmarks"][duplicate]))
    _save(run, run_file)
    try:
        verdict = _gate_saved(run_file)
        refused = _start_up_check(run_file)
    finally:
        _save(BASELINE_RUN, run_file)
    assert verdict.comparisons == reference.comparisons and not verdict.failed
    if duplicate is None:
        assert refused is None
    else:  # pytest-benchmark keeps the last of the two: the start-up check refuses the run, naming both
        name = run["benchmarks"][duplicate]["fullname"]
        assert refused.startswith(f"{run_file}: {name}: in the run twice (its case records ") and "\n" not in refused
