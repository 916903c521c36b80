"""What the driver says about each GPU's state: nvidia-smi's answers parsed, NVML asked, neither there."""

import os
import sys
import types

from trainbench import gpu_state
from trainbench.gpu_state import GpuProcess, GpuState

H100_UUID = "GPU-5a0e9b3e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
SMI_GPUS = f"""0, {H100_UUID}, NVIDIA H100 80GB HBM3, Disabled, 1980, 1980, 1755, 1755
1, GPU-77777777-0000-0000-0000-000000000000, NVIDIA A100-SXM4-40GB, Enabled, 210, 1410, 1200, 1410
2, GPU-88888888-0000-0000-0000-000000000000, NVIDIA L4, [N/A], 2040, 2040, [N/A], [N/A]
"""
SMI_APPS = f"""{H100_UUID}, 4242, 30210
{H100_UUID}, {os.getpid()}, 500
GPU-77777777-0000-0000-0000-000000000000, 99, [N/A]
"""


def test_nvidia_smis_answers_give_each_gpus_mig_mode_clocks_and_other_processes():
    gpus = gpu_state.with_processes(gpu_state._parse_gpus(SMI_GPUS), gpu_state._parse_apps(SMI_APPS, os.getpid()))
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
