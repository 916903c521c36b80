"""The software a run's numbers depend on besides its code and its device, and what differs between two runs.

A driver, CUDA, cuDNN, cuBLAS, NCCL or torch update can change which kernels run, and so step time and kernel
counts, with no change to the code. A comparison across such an update is still made (refusing it would leave a
runner update unjudged), but its verdict names what differs, so a change reads with its likely cause.
The versions come from the device identity each run records (``trainbench.device``'s ``identity()``).
"""

from __future__ import annotations

ENVIRONMENT_KEYS = ("torch", "driver", "cuda", "cudnn", "cublas", "nccl")


def environment_differences(baseline: dict | None, current: dict | None) -> list[str]:
    """One ``"KEY X there, Y here"`` per ``ENVIRONMENT_KEYS`` entry both identities recorded and that differs (a key
    one side lacks, as in runs recorded before it was, says nothing)."""
    if not isinstance(baseline, dict) or not isinstance(current, dict):
        return []
    return [f"{key} {baseline[key]} there, {current[key]} here" for key in ENVIRONMENT_KEYS
            if baseline.get(key) is not None and current.get(key) is not None and baseline[key] != current[key]]
