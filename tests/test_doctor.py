"""``python -m trainbench doctor``: each check against fake machines, and the command's exit status."""

import json

import pytest
import torch

from trainbench.__main__ import main
from trainbench.devices import host
from trainbench.devices.device import DeviceCaps, unsupported_arch
from trainbench.jobs import doctor
from trainbench.jobs.doctor import Check, check_cuda, check_device_memory, check_shm, check_timing

CU130_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
MiB, GiB = 1 << 20, 1 << 30


def runtime(torch_cuda="13.0", available=True, devices=(), driver="580.65.06", error=None, arch_list=CU130_ARCHS):
    """A ``cuda_runtime()`` dict of a machine that is not this one."""
    return {"torch": "2.14.1+cu130" if torch_cuda else "2.14.1+cpu", "torch_cuda": torch_cuda,
            "arch_list": list(arch_list) if torch_cuda else [], "available": available, "devices": list(devices),
            "driver": driver, "error": error}


def gpu(index=0, name="NVIDIA H100 80GB HBM3", capability=(9, 0), memory=80 * GiB, arch_list=CU130_ARCHS):
    return {"index": index, "name": name, "capability": capability, "total_memory_bytes": memory,
            "unsupported": unsupported_arch(capability, arch_list)}


def by_name(checks):
    return {c.name: c for c in checks}


def blockers(checks):
    return [c for c in checks if c.status == "FAIL"]


# -- CUDA situations ----------------------------------------------------------------------------------

def test_a_driver_too_old_for_the_wheel_blocks_an_expected_gpu_run_and_names_the_wheel_for_it():
    checks = by_name(check_cuda(runtime(available=False, driver="550.54.15"), expect_cuda=True))
    cuda = checks["cuda"]
    assert cuda.status == "FAIL"
    assert "driver 550.54.15 is older than CUDA 13.0 needs (>= 580)" in cuda.message
    assert "--index-url https://download.pytorch.org/whl/cu126" in cuda.message and "torch==2.14.1" in cuda.message
    assert checks["driver"] == Check("driver", "info", "NVIDIA driver 550.54.15")


def test_a_recent_driver_is_not_blamed():
    cuda = by_name(check_cuda(runtime(available=False, driver="580.65.06"), expect_cuda=True))["cuda"]
    assert cuda.status == "FAIL" and "is older than" not in cuda.message and "new enough for CUDA 13.0" in cuda.message


def test_no_gpu_where_none_is_expected_measures_the_cpu_profile():
    checks = check_cuda(runtime(available=False, driver=None), expect_cuda=False)
    assert not blockers(checks)
    assert by_name(checks)["cuda"].status == "info" and "CPU profile" in by_name(checks)["cuda"].message


def test_no_driver_at_all_says_to_pass_the_gpus_into_the_container():
    cuda = by_name(check_cuda(runtime(available=False, driver=None), expect_cuda=True))["cuda"]
    assert cuda.status == "FAIL" and "--gpus all" in cuda.message


def test_hidden_gpus_are_named_as_the_cause():
    cuda = by_name(check_cuda(runtime(available=False), True, {"CUDA_VISIBLE_DEVICES": ""}))["cuda"]
    assert cuda.status == "FAIL" and "CUDA_VISIBLE_DEVICES" in cuda.message


def test_a_v100_on_a_cu130_build_is_a_blocker_naming_the_cu126_wheel():
    v100 = gpu(name="Tesla V100-SXM2-16GB", capability=(7, 0), memory=16 * GiB)
    checks = by_name(check_cuda(runtime(devices=[v100]), expect_cuda=True))
    assert checks["cuda"].status == "ok"
    arch = checks["gpu0_arch"]
    assert arch.status == "FAIL"
    assert "sm_70" in arch.message and "whl/cu126" in arch.message


def test_an_unsupported_gpu_the_run_does_not_use_only_warns():
    v100 = gpu(name="Tesla V100-SXM2-16GB", capability=(7, 0))
    assert by_name(check_cuda(runtime(devices=[v100]), False, gpus_used=False))["gpu0_arch"].status == "warn"


def test_a_supported_gpu_passes():
    checks = check_cuda(runtime(devices=[gpu()]), expect_cuda=True)
    assert not blockers(checks)
    assert by_name(checks)["gpu0_arch"].status == "ok"
    assert "NVIDIA H100 80GB HBM3" in by_name(checks)["cuda"].message


def test_a_cpu_only_build_blocks_only_a_run_that_expects_cuda():
    expected = by_name(check_cuda(runtime(torch_cuda=None, available=False, driver=None), expect_cuda=True))["cuda"]
    assert expected.status == "FAIL" and "CPU-only" in expected.message and "whl/cu130" in expected.message
    assert not blockers(check_cuda(runtime(torch_cuda=None, available=False, driver=None), expect_cuda=False))


def test_an_unknown_driver_on_a_gpu_machine_warns():
    assert by_name(check_cuda(runtime(devices=[gpu()], driver=None), True))["driver"].status == "warn"


def test_cuda_is_expected_from_the_flag_the_environment_or_a_cuda_device():
    assert not doctor.expects_cuda(False, "auto", {})
    assert not doctor.expects_cuda(False, "cpu", {"TRAINBENCH_EXPECT_CUDA": "0"})
    assert doctor.expects_cuda(True, "auto", {})
    assert doctor.expects_cuda(False, "auto", {"TRAINBENCH_EXPECT_CUDA": "1"})
    assert doctor.expects_cuda(False, "cuda:1", {})
    assert doctor.expects_cuda(False, "auto", {"TRAINBENCH_EXPECT_CUDA": "true"})  # was ignored: only "1" counted
    with pytest.raises(host.EnvError, match="TRAINBENCH_EXPECT_CUDA='maybe': expected 1 or 0"):
        doctor.expects_cuda(False, "auto", {"TRAINBENCH_EXPECT_CUDA": "maybe"})


@pytest.mark.parametrize("name", sorted(host.SWITCHES))
@pytest.mark.parametrize(("value", "on"), [("1", True), ("true", True), ("YES", True), (" on ", True), ("0", False),
                                           ("false", False), ("no", False), ("off", False), ("", None), (None, None)])
def test_every_switch_reads_on_and_off_alike_and_empty_as_its_default(name, value, on):
    environ = {} if value is None else {name: value}
    default = host.ENVIRONMENT[name].default
    assert host.env_switch(name, environ) == (default if on is None else on)


@pytest.mark.parametrize("value", ["2", "yess", "enable", "-1"])
def test_a_switch_neither_on_nor_off_is_refused_in_one_line(value):
    for name in host.SWITCHES:
        with pytest.raises(host.EnvError) as raised:
            host.env_switch(name, {name: value})
        assert str(raised.value).startswith(f"{name}={value!r}: expected 1 or 0") and "\n" not in str(raised.value)
    with pytest.raises(KeyError, match="not a trainbench switch"):
        host.env_switch("TRAINBENCH_UNKNOWN", {})


def test_the_device_a_run_would_use():
    two = runtime(devices=[gpu(0), gpu(1)])
    assert doctor.select_device("auto", two)[1] is True
    assert doctor.select_device("auto", runtime(available=False))[1] is False
    assert doctor.select_device("cuda:1", two) == (Check("device", "ok", "cuda:1 (NVIDIA H100 80GB HBM3), gpu profile"), True)
    assert doctor.select_device("cuda:2", two)[0].status == "FAIL"
    assert doctor.select_device("cuda", runtime(available=False))[0].status == "FAIL"
    assert doctor.select_device("cpu", two)[1] is False
    assert doctor.select_device("tpu", two)[0].status == "FAIL"


# -- memory ------------------------------------------------------------------------------------------

# What each heavy case's GPU-profile setup is predicted to hold (tensor peak), by workload: the GPT figure is
# what the read of the CUDA paths found, beyond any GPU up to an H200 once the runner's headroom is added.
PREDICTED_PEAK = {"gpt": 155_000 * MiB, "vit": 30_000 * MiB, "transformer": 20_000 * MiB, "resnet18": 8_000 * MiB}
H100 = DeviceCaps("cuda", "NVIDIA H100 80GB HBM3", cuda=True, capability=(9, 0), gpu_count=1, bf16=True)


def fake_prediction(config, spec):
    return {"breakdown_bytes": {"total": PREDICTED_PEAK[spec.name]}}


def test_a_case_too_large_for_the_gpu_is_skipped_as_the_runner_skips_it_not_a_blocker():
    from trainbench.core.setups.eligibility import Context, MemoryLimit, why_not
    from trainbench.core.setups.recipes import get_recipe
    from trainbench.core.setups.workloads import PROFILES, resolve_spec

    cases = {c.case_id: c for c in doctor.heaviest_cases(H100, 80 * GiB, fake_prediction)}
    assert set(cases) == set(doctor.HEAVIEST_CASES)
    gpt = cases["gpt-larger_batch"]
    profile = PROFILES["gpu"]
    runner_says = why_not(get_recipe("larger_batch"), H100, profile, resolve_spec("gpt", profile),
                          get_recipe("larger_batch").config(profile), Context(memory=MemoryLimit(80 * GiB, fake_prediction)))
    assert gpt.skipped == runner_says and "needs ~189.2 GiB" in gpt.skipped  # the runner's own answer, not a copy
    assert gpt.needed_bytes == int(155_000 * MiB * 1.25)
    assert cases["vit-larger_batch"].skipped is None and cases["vit-larger_batch"].needed_bytes == 37_500 * MiB

    checks = by_name(check_device_memory(gpu(memory=80 * GiB), list(cases.values())))
    assert not blockers(checks.values())
    memory = checks["gpu0_memory"]
    assert memory.status == "ok"
    assert memory.message == ("NVIDIA H100 80GB HBM3 has 81,920 MiB; the largest case that will run "
                              "(vit-larger_batch) needs 37,500 MiB with the memory gate's headroom")
    skipped = checks["gpu0_memory:gpt-larger_batch"]
    assert skipped.status == "info"
    assert skipped.message.startswith("gpt-larger_batch will be skipped (needs 193,750 MiB of 81,920): ")


def test_a_healthy_h100_is_not_warned_about_the_largest_case_the_gate_lets_run():
    # vit-larger_batch needs 72.4 GiB with the gate's headroom on a 79.1 GiB H100: it fits, as the gate says
    from trainbench.devices.fleet import H100_SXM

    caps = DeviceCaps("cuda", H100_SXM.name, cuda=True, capability=H100_SXM.capability, gpu_count=1, bf16=True)
    peaks = {**PREDICTED_PEAK, "vit": int(72.4 * GiB / 1.25)}
    cases = doctor.heaviest_cases(caps, H100_SXM.memory_bytes,
                                  lambda config, spec: {"breakdown_bytes": {"total": peaks[spec.name]}})
    checks = check_device_memory(gpu(memory=H100_SXM.memory_bytes), cases)
    assert [c.status for c in checks if c.status in ("warn", "FAIL")] == []
    assert by_name(checks)["gpu0_memory"].status == "ok" and "(vit-larger_batch) needs 74,138 MiB" in \
        by_name(checks)["gpu0_memory"].message


def test_device_memory_lines_for_a_tight_fit_nothing_predicted_and_nothing_running():
    tight = [doctor.CaseMemory("vit-larger_batch", 15 * GiB)]
    assert check_device_memory(gpu(memory=16 * GiB), tight)[0].status == "ok"  # the headroom is in the need already
    over = check_device_memory(gpu(memory=16 * GiB), [doctor.CaseMemory("vit-larger_batch", 17 * GiB)])
    assert over[0].status == "warn" and "run out of memory" in over[0].message  # a case no gate skipped
    unpredicted = check_device_memory(gpu(memory=16 * GiB), [doctor.CaseMemory("gpt-larger_batch", None)])
    assert unpredicted[0].status == "info" and "gpt-larger_batch needs is not predicted" in unpredicted[0].message
    none_run = check_device_memory(gpu(memory=16 * GiB), [doctor.CaseMemory("gpt-larger_batch", 40 * GiB, "too big")])
    assert [c.status for c in none_run] == ["info", "info"] and "none of " in none_run[0].message


def test_shared_memory_needed_by_workers():
    assert host.shm_needed_bytes(10 * MiB, num_workers=0) == 0
    assert host.shm_needed_bytes(10 * MiB, num_workers=8) == 170 * MiB  # 8 workers x 2 prefetched + the one in use
    assert host.shm_needed_bytes(10 * MiB, num_workers=2, prefetch_factor=4) == 90 * MiB


def test_too_little_shared_memory_is_a_blocker_with_the_docker_fix():
    largest = ("resnet18-multiprocess_loading", 20 * MiB, 8)
    short = check_shm(64 * MiB, largest, "gpu")
    assert short.status == "FAIL"
    assert "bus error" in short.message and "--shm-size=1g" in short.message and "--ipc=host" in short.message
    assert check_shm(1 * GiB, largest, "gpu").status == "ok"
    assert check_shm(None, largest, "gpu").status == "info"
    assert check_shm(0, None, "cpu").status == "ok"


def test_shm_free_bytes_reads_the_mount(tmp_path):
    assert host.shm_free_bytes(str(tmp_path / "missing")) is None
    free = host.shm_free_bytes(str(tmp_path))
    assert free is None or free > 0  # None only off Linux


def test_the_largest_worker_batch_is_what_its_loader_collates():
    from torch.utils.data import DataLoader

    from trainbench.core.setups.cases import all_cases
    from trainbench.core.setups.spec import batch_nbytes
    from trainbench.core.setups.workloads import PROFILES, resolve_spec

    case_id, batch_bytes, workers = doctor.largest_worker_batch("cpu")
    assert workers > 0
    profile = PROFILES["cpu"]
    case = next(c for c in all_cases() if c.id == case_id)
    config = case.recipe(None, profile).config(profile)
    spec = resolve_spec(case.workload, profile)
    dataset = spec.dataset(pixels=config.pixels) if config.pixels else spec.dataset()
    batch = next(iter(DataLoader(dataset, batch_size=config.loader_batch_size(spec))))
    assert batch_bytes == batch_nbytes(batch)


def test_the_gpu_profile_outgrows_dockers_default_shared_memory():
    case_id, batch_bytes, workers = doctor.largest_worker_batch("gpu")
    assert host.shm_needed_bytes(batch_bytes, workers) > 64 * MiB
    assert check_shm(64 * MiB, (case_id, batch_bytes, workers), "gpu").status == "FAIL"


def test_shared_memory_is_sized_for_the_recipe_cases_and_only_warns_for_a_larger_ladder_rung():
    recipes, rungs = doctor.largest_worker_batch("gpu"), doctor.largest_worker_batch("gpu", rungs=True)
    assert "ladder" not in recipes[0] and "ladder" in rungs[0]
    assert host.shm_needed_bytes(*recipes[1:]) < 2 * GiB < host.shm_needed_bytes(*rungs[1:])  # fp32 images, 8 workers
    for free in (2 * GiB, 4 * GiB):  # a host with a few GiB runs every recipe case: the larger rungs would not
        check = check_shm(free, recipes, "gpu", largest_rung=rungs)
        assert check.status == "warn" and rungs[0] in check.message and "--shm-size=" in check.message
    assert check_shm(64 * MiB, recipes, "gpu", largest_rung=rungs).status == "FAIL"
    assert check_shm(16 * GiB, recipes, "gpu", largest_rung=rungs).status == "ok"
    assert check_shm(GiB, None, "gpu", largest_rung=("x-ladder000-1_workers", MiB, 2)).status == "ok"


# -- environment and host ----------------------------------------------------------------------------

def test_timing_distortions_from_the_environment_and_process_state():
    clean = host.timing_distortions({}, anomaly_enabled=False, profiler_enabled=False, torch_threads=2, cpu_count=2)
    assert clean == []
    env = {"CUDA_LAUNCH_BLOCKING": "1", "TORCH_SHOW_CPP_STACKTRACES": "0", "PYTORCH_NO_CUDA_MEMORY_CACHING": "true"}
    names = [n for n, _ in host.timing_distortions(env, True, True, 2, 2)]
    assert names == ["CUDA_LAUNCH_BLOCKING", "PYTORCH_NO_CUDA_MEMORY_CACHING", "anomaly_mode", "profiler"]


def test_threads_over_or_far_under_the_cores():
    over = dict(host.timing_distortions({"OMP_NUM_THREADS": "16"}, False, False, 16, 4))
    assert "oversubscription" in over["torch_threads"] and "OMP_NUM_THREADS=16" in over["OMP_NUM_THREADS"]
    under = dict(host.timing_distortions({}, False, False, 1, 16))
    assert "fraction" in under["torch_threads"]
    assert host.timing_distortions({}, False, False, 8, 16) == []  # physical cores of 16 hyperthreads
    assert "OMP_NUM_THREADS" in dict(host.timing_distortions({"OMP_NUM_THREADS": "all"}, False, False, 2, 2))


def test_launch_blocking_blocks_a_gpu_run_and_warns_on_the_cpu():
    distortions = host.timing_distortions({"CUDA_LAUNCH_BLOCKING": "1"}, False, False, 2, 2)
    assert [c.status for c in check_timing(distortions, uses_cuda=True)] == ["FAIL"]
    assert [c.status for c in check_timing(distortions, uses_cuda=False)] == ["warn"]
    assert check_timing([], uses_cuda=True)[0].status == "ok"


def test_cpu_governors_counted_from_sysfs(tmp_path):
    for cpu, governor in [(0, "performance"), (1, "powersave"), (2, "powersave")]:
        folder = tmp_path / f"cpu{cpu}" / "cpufreq"
        folder.mkdir(parents=True)
        (folder / "scaling_governor").write_text(governor + "\n")
    (tmp_path / "cpufreq").mkdir()  # not a core
    governors = host.cpu_governors(str(tmp_path))
    assert governors == {"performance": 1, "powersave": 2}
    assert host.cpu_governors(str(tmp_path / "missing")) == {}
    by = by_name(doctor.check_cpu("AMD EPYC", 3, 3, "AVX512", governors, None))
    assert by["cpu_governor"].status == "warn" and "2 powersave of 3" in by["cpu_governor"].message
    assert by_name(doctor.check_cpu("x", 3, 3, "AVX2", {"performance": 3}, None))["cpu_governor"].status == "ok"
    assert by_name(doctor.check_cpu("x", 3, 3, "AVX2", {}, None))["cpu_governor"].status == "info"


def test_a_cgroup_quota_under_the_threads_warns(tmp_path):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("200000 100000\n")
    assert host.cgroup_cpu_quota(str(cpu_max)) == 2.0
    cpu_max.write_text("max 100000\n")
    assert host.cgroup_cpu_quota(str(cpu_max)) is None
    assert host.cgroup_cpu_quota(str(tmp_path / "missing")) is None
    assert by_name(doctor.check_cpu("x", 16, 16, "AVX2", {}, 2.0))["cpu_quota"].status == "warn"
    assert "cpu_quota" not in by_name(doctor.check_cpu("x", 16, 16, "AVX2", {}, 16.0))


def test_cublas_workspace_config_is_reported():
    assert host.cublas_workspace_config({}) is None
    assert host.cublas_workspace_config({"CUBLAS_WORKSPACE_CONFIG": ":16:8"}) == ":16:8"
    assert ":16:8" in doctor.check_cublas(":16:8").message
    assert ":4096:8" in doctor.check_cublas(None).message


def test_the_allocator_configuration_is_recorded_and_a_tf32_override_warns():
    assert by_name(doctor.check_cuda_env({}))["cuda_alloc_conf"].message.startswith("PYTORCH_CUDA_ALLOC_CONF unset")
    conf = by_name(doctor.check_cuda_env({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}))
    assert conf["cuda_alloc_conf"].status == "info" and "expandable_segments:True" in conf["cuda_alloc_conf"].message
    off = by_name(doctor.check_cuda_env({"NVIDIA_TF32_OVERRIDE": "0"}))["tf32_override"]
    assert off.status == "warn" and "whatever torch's flags say" in off.message
    assert by_name(doctor.check_cuda_env({"NVIDIA_TF32_OVERRIDE": "1"}))["tf32_override"].status == "info"
    assert by_name(doctor.check_cuda_env({}))["tf32_override"].status == "info"


def test_library_logging_distorts_timing_as_a_warning():
    distortions = host.timing_distortions({"CUDNN_LOGINFO_DBG": "1", "CUBLASLT_LOG_LEVEL": "2"}, False, False, 2, 2)
    assert [c.status for c in check_timing(distortions, uses_cuda=True)] == ["warn", "warn"]
    assert host.timing_distortions({"CUBLASLT_LOG_LEVEL": "0"}, False, False, 2, 2) == []


def _gpu_states(*processes, mig=False, app=1755):
    from trainbench.devices.gpu_state import GpuProcess, GpuState

    h100 = GpuState(0, "GPU-5a0e9b3e", "NVIDIA H100 80GB HBM3", mig, 1980, 1980, app, 1755,
                    tuple(GpuProcess(pid, mib) for pid, mib in processes))
    other = GpuState(1, "GPU-77777777", "NVIDIA H100 80GB HBM3", False, 1980, 1980, 1755, 1755, ((GpuProcess(9, 1),)))
    return "nvidia-smi", [h100, other]


def test_other_processes_mig_and_clocks_of_the_gpu_the_run_sees():
    seen = [{**gpu(), "uuid": "5a0e9b3e"}]  # torch's bare UUID of the driver's GPU 0
    quiet = by_name(doctor.check_gpu_state(_gpu_states(), seen))
    assert set(quiet) == {"gpu0_processes", "gpu0_mig", "gpu0_clocks"}  # the other GPU's process is not this run's
    assert quiet["gpu0_processes"].status == "ok" and quiet["gpu0_mig"].status == "ok"
    assert quiet["gpu0_clocks"].status == "info" and "not locked" in quiet["gpu0_clocks"].message
    busy = by_name(doctor.check_gpu_state(_gpu_states((4242, 30210), mig=True, app=1410), seen))
    assert busy["gpu0_processes"].status == "warn" and "pid 4242 30,210 MiB" in busy["gpu0_processes"].message
    assert busy["gpu0_mig"].status == "warn"
    assert "applications clocks set to 1410 MHz (default 1755)" in busy["gpu0_clocks"].message
    unmatched = doctor.check_gpu_state(_gpu_states(), [gpu()])  # no UUID from torch: every GPU the driver has
    assert {c.name for c in unmatched} >= {"driver_gpu0_processes", "driver_gpu1_processes"}
    [nothing] = doctor.check_gpu_state(None, seen)
    assert nothing.status == "info" and "not checked" in nothing.message


def test_a_missing_compiler_or_python_header_names_the_compile_cases_that_would_fail(tmp_path):
    cases = doctor.compile_cases("gpu")
    assert {"resnet18-compile", "gpt-compile", "gelu_mlp-fuse_pointwise_compile"} <= set(cases)
    assert "resnet18-baseline" not in cases
    no_cc = doctor.check_compile_toolchain(True, None, "/usr/include/python3.11/Python.h", cases)
    assert no_cc.status == "warn" and "C compiler" in no_cc.message and "gpt-compile" in no_cc.message
    no_header = doctor.check_compile_toolchain(False, "/usr/bin/c++", None, cases)
    assert no_header.status == "warn" and "Python.h" in no_header.message and "C++ compiler" not in no_header.message
    assert doctor.check_compile_toolchain(True, "/usr/bin/cc", "/x/Python.h", cases).status == "ok"


def test_the_compiler_is_found_as_torch_compile_looks_for_it(monkeypatch, tmp_path):
    gcc = tmp_path / "gcc"
    gcc.write_text("#!/bin/sh\n")
    gcc.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert host.c_compiler({}) == str(gcc)  # no cc: the next name
    assert host.c_compiler({}, cxx=True) is None
    assert host.c_compiler({"CC": "clang"}) is None  # the one CC names, not another
    assert host.c_compiler({"CC": str(gcc)}) == str(gcc)
    import sysconfig

    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"include": str(tmp_path)})
    assert host.python_header() is None  # headers not installed (no python3-dev)
    (tmp_path / "Python.h").write_text("")
    assert host.python_header() == str(tmp_path / "Python.h")


def test_record_counts_blockers_and_warnings():
    checks = [Check("a", "ok", "x"), Check("b", "warn", "y"), Check("c", "FAIL", "z"), Check("d", "FAIL", "w")]
    record = doctor.doctor_record(checks)
    assert record["blockers"] == 2 and record["warnings"] == 1
    assert record["checks"][2] == {"name": "c", "status": "FAIL", "message": "z"}
    assert json.loads(json.dumps(record)) == record
    assert doctor.format_checks(checks[:1] + checks[2:3]) == ["ok    a: x", "FAIL  c: z"]
    with pytest.raises(ValueError, match="status"):
        Check("e", "error", "not a status")


# -- the command -------------------------------------------------------------------------------------

@pytest.fixture
def quiet_env(monkeypatch):
    """This machine without settings a CI runner may carry that would change the verdict."""
    for name in [*host.DISTORTING_ENV, "TRAINBENCH_EXPECT_CUDA", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(doctor, "cuda_runtime", lambda: runtime(available=False, driver=None))


def test_doctor_on_a_machine_without_a_gpu_passes_and_reports_the_cpu(quiet_env, capsys, tmp_path):
    out = tmp_path / "doctor.json"
    assert main(["doctor", "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(line.split(" ", 1)[0] in ("ok", "info", "warn") for line in lines)
    assert any(line.startswith("info  cuda:") and "CPU profile" in line for line in lines)
    assert any(line.startswith("info  cpu:") and f"torch uses {torch.get_num_threads()} threads" in line for line in lines)
    written = json.loads(out.read_text())
    assert [c["name"] for c in written][:2] == ["torch", "cuda"] and len(written) == len(lines)


@pytest.mark.parametrize("argv, env", [(["doctor", "--expect-cuda"], {}), (["doctor", "--device", "cuda"], {}),
                                       (["doctor"], {"TRAINBENCH_EXPECT_CUDA": "1"})])
def test_doctor_expecting_cuda_without_a_gpu_fails(quiet_env, monkeypatch, capsys, argv, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(argv) == 1
    failed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")]
    assert failed[0].startswith("FAIL  cuda: CUDA expected, but ") and "--gpus all" in failed[0]


def test_doctor_for_the_cpu_of_this_machine_passes(monkeypatch, capsys):
    # The real runtime: with --device cpu no GPU matter blocks, and the CPU profile needs a few MiB of /dev/shm.
    monkeypatch.delenv("TRAINBENCH_EXPECT_CUDA", raising=False)
    assert main(["doctor", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not [line for line in lines if line.startswith("FAIL")]
    assert any(line.startswith("ok    device: cpu (") and "cpu profile" in line for line in lines)


class _FakeH100:
    """The backend of a run on an H100 that asks no driver: what the doctor's memory check reads of it."""

    def caps(self):
        return H100


def test_doctor_on_an_h100_passes_and_names_what_the_largest_case_that_will_run_needs(quiet_env, monkeypatch, capsys,
                                                                                     tmp_path):
    from trainbench.core.analyses import predict

    monkeypatch.setattr(doctor, "cuda_runtime", lambda: runtime(devices=[{**gpu(memory=80 * GiB), "uuid": "5a0e9b3e"}]))
    monkeypatch.setattr(doctor, "get_backend", lambda spec: _FakeH100())
    monkeypatch.setattr(doctor, "gpu_states", lambda: _gpu_states((4242, 30210)))
    monkeypatch.setattr(predict, "predict_memory", lambda config, spec, backend: fake_prediction(config, spec))
    monkeypatch.setattr(host, "shm_free_bytes", lambda path: 64 * GiB)
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    assert main(["doctor", "--device", "cuda", "--json", str(tmp_path / "doctor.json")]) == 0
    recorded = {c["name"]: c["status"] for c in json.loads((tmp_path / "doctor.json").read_text())}
    assert {"gpu0_processes": "warn", "gpu0_mig": "ok", "gpu0_clocks": "info", "tf32_override": "warn",
            "cuda_alloc_conf": "info"}.items() <= recorded.items()
    assert recorded["compile_toolchain"] in ("ok", "warn")
    lines = capsys.readouterr().out.splitlines()
    assert "ok    gpu0_memory: NVIDIA H100 80GB HBM3 has 81,920 MiB; the largest case that will run " \
           "(vit-larger_batch) needs 37,500 MiB with the memory gate's headroom" in lines
    assert any(line.startswith("info  gpu0_memory:gpt-larger_batch: gpt-larger_batch will be skipped (needs 193,750 MiB")
               for line in lines)



def test_doctor_refuses_a_json_folder_and_an_empty_gpu_before_any_check(tmp_path, capsys, monkeypatch):
    """doctor --json DIR failed with a traceback after its checks; --simulate-gpu "" ran this machine's doctor."""
    from trainbench.jobs import doctor

    monkeypatch.setattr(doctor, "run_checks", lambda *a: pytest.fail("checked before refusing"))
    assert main(["doctor", "--json", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"trainbench doctor: --json {tmp_path}: is a folder; expected a file path\n"
    assert main(["doctor", "--simulate-gpu", ""]) == 2
    assert capsys.readouterr().err.startswith("trainbench doctor: --simulate-gpu: unknown GPU ''")
