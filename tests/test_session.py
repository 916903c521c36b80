"""A session's saved runs, driven through inner pytest sessions (pytester): saves that cannot leave a partial run,
the baseline chosen (or refused) at start-up and named in the summary, a gate that compared nothing."""

import errno
import json
import os
import signal

import pytest

CASE = """
import functools

import pytest
import torch
from torch import nn
from trainbench.core.setups.spec import TrainingSpec, classification_loss
from trainbench.core.setups.workloads import FakeTokens

SPEC = TrainingSpec(name="tiny", model=lambda: nn.Sequential(nn.EmbeddingBag(100, 8), nn.Linear(8, 10)),
                    loss_fn=classification_loss, optimizer=functools.partial(torch.optim.SGD, lr=0.01),
                    dataset=lambda: FakeTokens(256, 8, 100), batch_size=16)


def test_tiny(train_bench):
    train_bench("baseline", SPEC)
"""
SKIPPED = CASE.replace('train_bench("baseline", SPEC)', 'pytest.skip("no data on this runner")')
GATE = "--trainbench-compare-fail=deterministic:0%"


@pytest.fixture(scope="module")
def _first_saved_run():
    """The run the first test of this module to need one saved: its path under the project and its bytes."""
    return {}


@pytest.fixture
def saved(pytester, quick_options, _first_saved_run):
    """A project with the tiny case and one saved run of it, 0001_base.json (its path): one session saves it,
    later tests get a copy of that file."""
    pytester.makepyfile(test_case=CASE)
    if not _first_saved_run:
        pytester.runpytest("--benchmark-save=base", *quick_options).assert_outcomes(passed=1)
        [path] = pytester.path.rglob("0001_base.json")
        _first_saved_run[path.relative_to(pytester.path)] = path.read_bytes()
    [(relative, content)] = _first_saved_run.items()
    (pytester.path / relative).parent.mkdir(parents=True, exist_ok=True)
    (pytester.path / relative).write_bytes(content)
    return pytester.path / relative


def _edited(path, name: str, edit) -> object:
    """A copy of the saved run at ``path`` named ``name`` beside it, with ``edit(run)`` applied."""
    run = json.loads(path.read_text())
    edit(run)
    path.with_name(name).write_text(json.dumps(run))
    return path.with_name(name)


class _MidWrite:
    """Stands in for the ``os`` module of trainbench.core.harness.files: each file it opens takes half of a write, then
    ``midway()`` happens (a full disk, a signal), then, if it returned, the rest."""

    def __getattr__(self, name):
        return getattr(os, name)

    def midway(self) -> None:
        raise NotImplementedError

    def fdopen(self, fd, mode):
        real, midway = os.fdopen(fd, mode), self.midway

        class HalfWriter:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                real.close()

            def write(self, data):
                real.write(data[: len(data) // 2])
                real.flush()
                midway()
                real.write(data[len(data) // 2:])

            def __getattr__(self, name):
                return getattr(real, name)

        return HalfWriter()


class _DiskFullMidWrite(_MidWrite):
    def midway(self) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _unserializable(*args, **kwargs):
    raise TypeError("Object of type Tensor is not JSON serializable")


@pytest.mark.parametrize(("fault", "message"), [("disk full mid-write", "No space left on device"),
                                                ("serialization fails", "is not JSON serializable")])
def test_a_save_that_fails_midway_leaves_no_partial_run_and_the_earlier_runs_intact(pytester, saved, quick_options,
                                                                                    monkeypatch, fault, message):
    before = saved.read_bytes()
    with monkeypatch.context() as patched:  # only this one: pytester's own patches (its working folder) stay
        if fault == "disk full mid-write":
            patched.setattr("trainbench.core.harness.files.os", _DiskFullMidWrite())
        else:  # pytest-benchmark's own save opened the file first: a 0-byte run was left
            patched.setattr("pytest_benchmark.utils.safe_dumps", _unserializable)
            patched.setattr("pytest_benchmark.storage.file.safe_dumps", _unserializable)
        result = pytester.runpytest("--benchmark-save=base", *quick_options)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # the numbers first, then one line saying the run was not saved and why; the last line says the run failed
    result.stdout.fnmatch_lines(["*trainbench summary*", "tiny-baseline *",
                                 f"trainbench: --benchmark-save: the run was not saved in *: *{message}*; "
                                 "its numbers are only in this summary"])
    assert result.outlines[-1] == "trainbench: FAILED: the run was not saved (exit 1)"
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert sorted(p.name for p in saved.parent.iterdir()) == ["0001_base.json"]  # no 0002, no temporary file
    assert saved.read_bytes() == before
    result = pytester.runpytest("--benchmark-compare", GATE, *quick_options)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["compared with *0001_base.json: the newest complete run of this * saved in *"])


class _SigtermMidWrite(_MidWrite):
    """Half of a write, then ``times`` SIGTERMs arrive, then the rest."""

    def __init__(self, times: int):
        self.times = times

    def midway(self) -> None:
        for _ in range(self.times):
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_sigterm_during_the_save_waits_for_the_whole_run_and_the_summary(pytester, saved, quick_options,
                                                                          monkeypatch):
    with monkeypatch.context() as patched:
        patched.setattr("trainbench.core.harness.files.os", _SigtermMidWrite(times=1))
        result = pytester.runpytest("--benchmark-save=base", *quick_options)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*trainbench summary*", "tiny-baseline *"])
    run = saved.with_name("0002_base.json")
    assert json.loads(run.read_text())["benchmarks"]  # whole: the write went on after the signal
    assert "trainbench_incomplete" not in json.loads(run.read_text())  # every case had finished
    assert result.outlines[-1] == f"trainbench: stopped by SIGTERM after the last case; the run was saved whole in {run} (exit 2)"
    assert sorted(p.name for p in saved.parent.iterdir()) == ["0001_base.json", "0002_base.json"]


def test_a_second_sigterm_during_the_save_stops_it_leaving_no_file_and_the_summary(pytester, saved, quick_options,
                                                                                  monkeypatch):
    with monkeypatch.context() as patched:
        patched.setattr("trainbench.core.harness.files.os", _SigtermMidWrite(times=2))
        result = pytester.runpytest("--benchmark-save=base", *quick_options)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*trainbench summary*", "tiny-baseline *",
                                 "trainbench: --benchmark-save: the run was not saved in *0002_base.json: "
                                 "KeyboardInterrupt: signal 15 (SIGTERM); its numbers are only in this summary"])
    assert result.outlines[-1] == "trainbench: FAILED: the run was not saved (exit 1)"
    assert sorted(p.name for p in saved.parent.iterdir()) == ["0001_base.json"]  # no partial run, no temporary file


@pytest.mark.parametrize("other", ["0002_base.json", "0002_other.json", ".0002.saving"])
def test_a_run_number_another_session_takes_meanwhile_is_never_overwritten(pytester, saved, quick_options,
                                                                           monkeypatch, other):
    """Another session saving to the same storage takes number 0002 after this one read the numbers (its run in
    place, or its mark while it writes): this run takes 0003."""
    from trainbench.plugin import benchmark_adapter

    numbered = benchmark_adapter.next_number

    def numbered_then_taken(storage):
        number = numbered(storage)
        (saved.parent / other).write_text("the other session's")
        return number

    with monkeypatch.context() as patched:
        patched.setattr(benchmark_adapter, "next_number", numbered_then_taken)
        result = pytester.runpytest("--benchmark-save=base", *quick_options)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert (saved.parent / other).read_text() == "the other session's"  # never overwritten
    assert json.loads(saved.with_name("0003_base.json").read_text())["benchmarks"]
    assert sorted(p.name for p in saved.parent.iterdir()) == sorted({"0001_base.json", other, "0003_base.json"})


def test_a_baseline_from_another_host_in_a_storage_outside_the_working_folder_is_compared(
        pytester, saved, quick_options, tmp_path_factory):
    """A CI layout: the storage an absolute path outside the checkout, the baseline saved on another host of the
    same device: pytest-benchmark's machine-info warning named the storage relative to the working folder."""
    storage = tmp_path_factory.mktemp("ci-storage")
    (storage / saved.parent.name).mkdir()
    _edited(saved, "0001_base.json", lambda run: run["machine_info"].update(node="another-host"))
    saved.with_name("0001_base.json").rename(storage / saved.parent.name / "0001_base.json")
    from pytest_benchmark.logger import PytestBenchmarkWarning

    with pytest.warns(PytestBenchmarkWarning, match=f"another-host.*[(]location: {storage}[)]"):
        result = pytester.runpytest(f"--benchmark-storage={storage}", "--benchmark-compare", GATE, *quick_options)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["compared with *0001_base.json*"])


FAILS = CASE.replace("from trainbench.core.setups.workloads import FakeTokens", """from trainbench.core.setups.workloads import FakeTokens


def runs_out_of_memory(model, batch):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (planted)")""").replace(
    "loss_fn=classification_loss", "loss_fn=runs_out_of_memory")


def test_a_run_whose_every_case_failed_is_saved_with_them_and_never_a_baseline(pytester, saved, quick_options):
    pytester.makepyfile(test_case=FAILS)
    result = pytester.runpytest("--benchmark-save=base", *quick_options)
    result.assert_outcomes(failed=1)
    run = json.loads(saved.with_name("0002_base.json").read_text())
    assert run["benchmarks"] == [] and run["machine_info"]["trainbench"]["kind"] == "cpu"
    assert [failed["case"] for failed in run["trainbench_failed_cases"]] == ["tiny-baseline"]
    pytester.makepyfile(test_case=CASE)
    result = pytester.runpytest("--benchmark-compare", GATE, *quick_options)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["compared with *0001_base.json: * (passed over newer runs: with every case failed "
                                 "0002_base.json)"])
    result = pytester.runpytest("--benchmark-compare=0002", GATE, *quick_options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*trainbench: --*: *0002_base.json: a run in which every case failed "
                                 "(trainbench_failed_cases, no benchmark), never a baseline*"])


def test_a_plain_benchmark_session_saves_through_pytest_benchmark_itself(pytester, monkeypatch):
    pytester.makepyfile(test_plain="def test_plain(benchmark):\n    benchmark(sum, range(10))\n")
    monkeypatch.setattr("trainbench.core.harness.files.os", _DiskFullMidWrite())  # not used: the plain session's save is its own
    result = pytester.runpytest("--benchmark-save=plain", "--benchmark-max-time=0.01", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert [p.name for p in pytester.path.rglob("*.json")] == ["0001_plain.json"]


@pytest.mark.parametrize("compare", ["--benchmark-compare", "--benchmark-compare=*_base"])
@pytest.mark.parametrize("gate", [[GATE], []])
def test_an_unreadable_newest_run_stops_a_trainbench_session_before_any_case(pytester, saved, quick_options,
                                                                            compare, gate):
    truncated = saved.with_name("0002_base.json")
    truncated.write_text(saved.read_text()[:500])  # a save killed mid-write, before saves were atomic
    result = pytester.runpytest(compare, *gate, *quick_options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*trainbench: --*: {truncated.relative_to(pytester.path)}: invalid JSON "
                                 "(*truncated?); expected a pytest-benchmark JSON run; it is the newest run *"])
    assert "passed" not in result.stdout.str()
    pytester.makepyfile(test_case="def test_plain(benchmark):\n    benchmark(sum, range(10))\n")
    plain = pytester.runpytest(compare, "--benchmark-max-time=0.01", "-p", "no:cacheprovider")
    plain.assert_outcomes(passed=1)  # no trainbench case: pytest-benchmark's own warning, as without trainbench


@pytest.mark.parametrize("how", ["number", "path"])
def test_an_interrupted_run_named_explicitly_is_refused_in_one_line(pytester, saved, quick_options, how):
    interrupted = _edited(saved, "0002_base.json", lambda run: run.update(trainbench_incomplete=True))
    name = "0002" if how == "number" else str(interrupted)
    result = pytester.runpytest(f"--benchmark-compare={name}", GATE, *quick_options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*trainbench: --*: *0002_base.json: *interrupted* (trainbench_incomplete: its "
                                 "session was stopped before the end), never a baseline; compare with a complete run*"])


def test_the_summary_names_the_baseline_and_why_passing_over_an_interrupted_run(pytester, saved, quick_options):
    _edited(saved, "0002_base.json", lambda run: run.update(trainbench_incomplete=True))
    result = pytester.runpytest("--benchmark-compare=*_base", GATE, *quick_options)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines([f"compared with {saved.relative_to(pytester.path)}: the newest complete run of this "
                                 "* (cpu, *) matching '*_base' in * (passed over newer runs: interrupted "
                                 "0002_base.json)"])


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("samples_per_s", "fast", "samples_per_s = 'fast': expected a finite number or null"),
    ("activation_mib", [1.0], "activation_mib = [[]1.0[]]: expected a finite number or null"),
    ("round_step_times_s", 0.1, "round_step_times_s: expected a list of finite seconds"),
    # deep in the record: the attribution table once passed start-up and crashed the verdict with TypeError
    ("attribution.ops.aten.mm", "6", "attribution.ops[[]'aten.mm'[]] = '6': expected a finite number"),
    ("ops_per_step", -120, "ops_per_step = -120: expected a value >= 0"),
    ("samples_per_s", 0.0, "samples_per_s = 0.0: expected a samples/s above 0*")])
@pytest.mark.parametrize("gate", [[GATE], []])
def test_a_wrong_typed_baseline_record_stops_the_session_before_any_case(pytester, saved, quick_options, field,
                                                                        value, expected, gate):
    def wrong(run):
        info = run["benchmarks"][0]["extra_info"]
        if field.startswith("attribution."):
            info["attribution"] = {"ops": {"aten.mm": value}}  # planted whole: the quick options record none
        else:
            info[field] = value

    _edited(saved, saved.name, wrong)
    result = pytester.runpytest("--benchmark-compare", *gate, *quick_options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*trainbench: --*: *0001_base.json: test_case.py::test_tiny: {expected}"])
    assert "passed" not in result.stdout.str()


def test_a_gate_that_compared_nothing_fails_closed_and_writes_why(pytester, saved, quick_options):
    pytester.makepyfile(test_case=SKIPPED)  # every case skips on this runner
    result = pytester.runpytest("--benchmark-compare", GATE, "--trainbench-compare-json=verdict.json", *quick_options)
    result.assert_outcomes(skipped=1, failed=1)  # the failed gate, in pytest's own count
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["FAIL trainbench compare vs *0001_base.json: nothing compared: no trainbench case "
                                 "ran (each was skipped or deselected); a gate that saw nothing never passes"])
    verdict = json.loads((pytester.path / "verdict.json").read_text())
    assert verdict["failed"] and verdict["gated"] and verdict["comparisons"] == []
    assert verdict["nothing_compared"] == "no trainbench case ran (each was skipped or deselected)"
    ungated = pytester.runpytest("--benchmark-compare", *quick_options)
    assert ungated.ret == pytest.ExitCode.OK
    ungated.stdout.fnmatch_lines(["trainbench compare vs *0001_base.json: nothing compared: no trainbench case ran*"])


XDIST_WORKER_1_OF_2 = """
import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    config.workerinput = {"workercount": 2, "workerid": "gw1"}  # what pytest-xdist gives its second worker
"""


def test_an_xdist_worker_is_pinned_to_its_gpu_before_the_doctor_asks_cuda_anything(pytester, monkeypatch):
    """With --trainbench-device=auto on two GPUs, worker gw1 sees only the second one from the first CUDA query on:
    CUDA reads CUDA_VISIBLE_DEVICES once, at its start."""
    import importlib

    import torch

    # Through sys.modules: an earlier inner session may have left a stale ``trainbench.jobs.doctor`` attribute behind.
    device, doctor = importlib.import_module("trainbench.devices.device"), importlib.import_module("trainbench.jobs.doctor")
    calls = []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 2)
    real_pin = device.pin_to_one_gpu

    def pin(index, count):
        calls.append(("pin", os.environ["CUDA_VISIBLE_DEVICES"]))
        return real_pin(index, count)

    def cuda_runtime():
        calls.append(("cuda query", os.environ["CUDA_VISIBLE_DEVICES"]))
        return {"torch": torch.__version__, "torch_cuda": None, "arch_list": [], "available": False, "devices": [],
                "driver": None, "error": None}

    monkeypatch.setattr(device, "pin_to_one_gpu", pin)
    monkeypatch.setattr(doctor, "cuda_runtime", cuda_runtime)
    monkeypatch.delenv("TRAINBENCH_EXPECT_CUDA", raising=False)
    pytester.makeconftest(XDIST_WORKER_1_OF_2)
    pytester.makepyfile(test_case=CASE)
    result = pytester.runpytest("--collect-only", "--trainbench-device=auto", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert calls == [("pin", "0,1"), ("cuda query", "1")]


UNLISTED_BASELINE = CASE.replace('''def test_tiny(train_bench):
    train_bench("baseline", SPEC)''', '''@pytest.mark.parametrize("recipe", ["optimizer_foreach", "optimizer_fused"])
def test_tiny(train_bench, recipe):
    train_bench(recipe, SPEC)''')


def test_a_recipe_whose_baseline_was_not_listed_is_compared_with_it_measured_once(pytester, quick_options):
    pytester.makepyfile(test_case=UNLISTED_BASELINE)
    result = pytester.runpytest("--benchmark-json=out.json", *quick_options)
    result.assert_outcomes(passed=2, warnings=1)  # one NoBudgetWarning for the file
    # unpaired (~), or timed on a busy machine (?) where the machine running the tests is loaded
    result.stdout.fnmatch_lines(["*trainbench summary*", "tiny-optimizer_foreach * [0-9]*.[0-9][0-9]x[~?] *",
                                 "tiny-optimizer_fused * [0-9]*.[0-9][0-9]x[~?] *"])
    records = {b["extra_info"]["case"]: b["extra_info"] for b in json.loads((pytester.path / "out.json").read_text())
               ["benchmarks"]}
    foreach, fused = records["tiny-optimizer_foreach"], records["tiny-optimizer_fused"]
    assert foreach["baseline"] == fused["baseline"] == "optimizer_loop"
    assert foreach["speedup_vs_baseline"] > 0 and fused["speedup_vs_baseline"] > 0
    # the first case measured the unlisted baseline right after itself; the second reuses that measurement
    assert any(n.startswith("baseline optimizer_loop measured right after, not interleaved (the session had not "
                            "measured optimizer_loop") for n in foreach["notes"])
    assert not any("optimizer_loop measured right after" in n for n in fused["notes"])
    assert not foreach["paired"] and not fused["paired"]  # nothing asked for pairing: "~"
    assert "tiny-optimizer_loop" not in records  # a baseline only: not a case of the session


def _without_machine_info(run, device=None, incomplete=False):
    del run["machine_info"]["trainbench"]
    for bench in run["benchmarks"]:
        info = bench["extra_info"]
        info["device"] = {**info["device"], **device} if device else info.pop("device") and None
        if info["device"] is None:
            del info["device"]
    if incomplete:
        run["trainbench_incomplete"] = True


@pytest.mark.parametrize(("edit", "expected"), [
    # no device anywhere: once compared as "pytest-benchmark's own choice", unchecked
    (_without_machine_info, "0002_base.json: no device recorded: machine_info has no 'trainbench' entry and "
                            "test_case.py::test_tiny has no device in its record*"),
    (lambda run: run["benchmarks"].append(json.loads(json.dumps(run["benchmarks"][0]))),
     "0002_base.json: test_case.py::test_tiny: in the run twice (its case records 0 and 1)*"),
])
def test_a_baseline_whose_device_cannot_be_read_or_with_a_case_twice_stops_the_session(pytester, saved, quick_options,
                                                                                      edit, expected):
    _edited(saved, "0002_base.json", edit)
    result = pytester.runpytest("--benchmark-compare", GATE, *quick_options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*trainbench: --trainbench-compare-fail: no baseline run to compare with: *{expected}"])
    assert "passed" not in result.stdout.str()


def test_an_interrupted_or_other_devices_run_known_by_its_records_alone_is_never_compared(pytester, saved, quick_options):
    _edited(saved, "0002_base.json", lambda run: _without_machine_info(run, {"kind": "cpu"}, incomplete=True))
    _edited(saved, "0003_base.json", lambda run: _without_machine_info(run, {"name": "AMD EPYC", "cpu_capability": "X"}))
    result = pytester.runpytest("--benchmark-compare", GATE, *quick_options)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["compared with *0001_base.json: * (passed over newer runs: of another device "
                                 "0003_base.json; interrupted 0002_base.json)"])


@pytest.mark.parametrize("gate", [[GATE], []])
def test_a_run_pytest_benchmark_loads_itself_is_checked_at_start_up(pytester, saved, quick_options, monkeypatch,
                                                                    gate):
    # e.g. a storage trainbench does not read (elasticsearch): pytest-benchmark's own choice, read in its compare hook
    _edited(saved, saved.name, lambda run: _without_machine_info(run, {"kind": "cpu"}, incomplete=True))
    with monkeypatch.context() as patched:
        patched.setattr("trainbench.plugin.baseline.choose_baseline", lambda *args, **options: None)
        result = pytester.runpytest("--benchmark-compare", *gate, *quick_options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*trainbench: --*: the run --benchmark-compare loaded: an interrupted run "
                                 "(trainbench_incomplete: *), never a baseline*"])
    assert "passed" not in result.stdout.str()
