"""What the driver says about each GPU's state: nvidia-smi's answers parsed, NVML asked, neither there."""

import os
import sys
import types

import pytest

from trainbench.devices import gpu_state
from trainbench.devices.gpu_state import GpuProcess, GpuState

PID_VISIBLE = gpu_state.pid_visible  # before the fixture below replaces it

H100_UUID = "GPU-5a0e9b3e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
SMI_GPUS = f"""0, {H100_UUID}, NVIDIA H100 80GB HBM3, Disabled, 1980, 1980, 1755, 1755
1, GPU-77777777-0000-0000-0000-000000000000, NVIDIA A100-SXM4-40GB, Enabled, 210, 1410, 1200, 1410
2, GPU-88888888-0000-0000-0000-000000000000, NVIDIA L4, [N/A], 2040, 2040, [N/A], [N/A]
"""
SMI_APPS = f"""{H100_UUID}, 4242, 30210
{H100_UUID}, {os.getpid()}, 500
GPU-77777777-0000-0000-0000-000000000000, 99, [N/A]
"""


@pytest.fixture(autouse=True)
def one_pid_namespace(monkeypatch):
    """The driver's PIDs are this namespace's (no container), whatever runs on this machine."""
    monkeypatch.setattr(gpu_state, "pid_visible", lambda pid: True)


def test_nvidia_smis_answers_give_each_gpus_mig_mode_clocks_and_other_processes():
    gpus = gpu_state.with_processes(gpu_state._parse_gpus(SMI_GPUS), gpu_state._parse_apps(SMI_APPS),
                                    frozenset({os.getpid()}))
    h100, a100, l4 = gpus
    assert (h100.mig, h100.sm_clock_mhz, h100.max_sm_clock_mhz, h100.app_clocks_set) == (False, 1980, 1980, False)
    assert h100.processes == (GpuProcess(4242, 30210),)  # this process left out
    assert (a100.mig, a100.app_clocks_set, a100.processes) == (True, True, (GpuProcess(99, None),))
    assert (l4.mig, l4.app_clocks_set, l4.processes) == (None, None, ())


def test_torchs_bare_uuid_and_the_drivers_name_one_gpu():
    assert gpu_state.same_gpu(H100_UUID, H100_UUID.removeprefix("GPU-").upper())
    assert not gpu_state.same_gpu(H100_UUID, "GPU-77777777-0000-0000-0000-000000000000")
    assert not gpu_state.same_gpu("", "")


class _NotSupported(Exception):
    pass


def _fake_pynvml():
    """nvidia-ml-py's pynvml on one H100 that has no MIG and one other process."""
    def not_supported(handle):
        raise _NotSupported

    clocks = {("SM", False): 1755, ("SM", True): 1980, ("GRAPHICS", "app"): 1755, ("GRAPHICS", "default"): 1980}
    return types.SimpleNamespace(
        NVML_CLOCK_SM="SM", NVML_CLOCK_GRAPHICS="GRAPHICS", nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: f"handle{i}",
        nvmlDeviceGetUUID=lambda h: H100_UUID.encode(), nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetMigMode=not_supported,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [types.SimpleNamespace(pid=7, usedGpuMemory=2 << 30),
                                                        types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=None)],
        nvmlDeviceGetClockInfo=lambda h, c: clocks[(c, False)], nvmlDeviceGetMaxClockInfo=lambda h, c: clocks[(c, True)],
        nvmlDeviceGetApplicationsClock=lambda h, c: clocks[(c, "app")],
        nvmlDeviceGetDefaultApplicationsClock=lambda h, c: clocks[(c, "default")])


def test_nvml_is_asked_first_where_nvidia_ml_py_is_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    source, [gpu] = gpu_state.gpu_states()
    assert source == "NVML"
    assert gpu == GpuState(0, H100_UUID, "NVIDIA H100 80GB HBM3", None, 1755, 1980, 1755, 1980, (GpuProcess(7, 2048),))
    assert gpu.app_clocks_set is True


def test_nvidia_smi_answers_where_nvml_cannot_and_nothing_where_neither_is_there(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncase \"$1\" in --query-gpu=*) cat <<'X'\n{SMI_GPUS}X\n;; *) cat <<'X'\n{SMI_APPS}X\n;; esac\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.defpath}")  # this nvidia-smi first; cat from the system
    source, gpus = gpu_state.gpu_states()
    assert source == "nvidia-smi" and [g.name for g in gpus][:1] == ["NVIDIA H100 80GB HBM3"] and len(gpus) == 3
    assert gpus[0].processes == (GpuProcess(4242, 30210),)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gpu_state.gpu_states() is None


def test_in_a_container_the_drivers_pids_are_not_taken_for_other_processes(monkeypatch, tmp_path):
    # The driver lists PIDs of the host's namespace: this run's own context there reads as a stranger's PID.
    monkeypatch.setattr(gpu_state, "pid_visible", lambda pid: pid in (1, 42))  # what this container's /proc has
    apps = gpu_state._parse_apps(f"{H100_UUID}, 731002, 500\n{H100_UUID}, 42, 100\n")
    [h100] = gpu_state.with_processes(gpu_state._parse_gpus(SMI_GPUS)[:1], apps, frozenset({1}))
    assert h100.processes == (GpuProcess(42, 100),) and h100.unmatched == (GpuProcess(731002, 500),)
    [alone] = gpu_state.with_processes(gpu_state._parse_gpus(SMI_GPUS)[:1], gpu_state._parse_apps(f"{H100_UUID}, 731002, 500"),
                                       frozenset({1}))
    assert alone.processes == () and alone.unmatched == (GpuProcess(731002, 500),)
    # this process's PIDs in nested namespaces, where its /proc shows them
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nNSpid:\t731002\t1\n")
    assert gpu_state.own_pids(str(status)) >= {731002, 1}
    assert gpu_state.own_pids(str(tmp_path / "missing")) == {os.getpid()}
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "42").mkdir()
    assert PID_VISIBLE(42, str(proc)) and not PID_VISIBLE(731002, str(proc))
    assert PID_VISIBLE(731002, str(tmp_path / "no-proc"))  # off Linux: one namespace assumed


def test_the_doctor_says_cannot_tell_for_one_unmatched_pid_and_warns_for_more():
    from trainbench.jobs.doctor import check_gpu_state

    def state(*unmatched, others=()):
        gpu = GpuState(0, H100_UUID, "NVIDIA H100 80GB HBM3", False, 1980, 1980, 1755, 1755, tuple(others),
                       tuple(GpuProcess(pid, 500) for pid in unmatched))
        return {c.name: c for c in check_gpu_state(("NVML", [gpu]), [{"index": 0, "uuid": H100_UUID}])}["gpu0_processes"]

    one = state(731002)
    assert one.status == "info" and "cannot tell" in one.message and "other process(es)" not in one.message
    two = state(731002, 731003)
    assert two.status == "warn" and "at most one is this run's own" in two.message
    assert state(731002, others=[GpuProcess(42, 1)]).status == "warn"
    assert state().status == "ok"
