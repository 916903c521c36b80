"""The software a run's numbers depend on besides its code and its device, and what differs between two runs.

A driver, CUDA, cuDNN, cuBLAS, NCCL or torch update can change which kernels run, and so step time and kernel
counts, with no change to the code; so can any other installed package (Triton, NumPy, a data library).
A comparison across such an update is still made (refusing it would leave a runner update unjudged), but its
verdict names what differs, so a change reads with its likely cause. The library versions come from the device
identity each run records (``trainbench.devices.device``'s ``identity()``); the packages from ``installed_packages()``,
recorded once per saved run and answered by each A/B side.
"""

from __future__ import annotations

import re
from importlib.metadata import distributions

ENVIRONMENT_KEYS = ("torch", "driver", "cuda", "cudnn", "cublas", "nccl")


def canonical_name(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503): ``Foo_Bar.baz`` -> ``foo-bar-baz``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_packages() -> dict[str, str]:
    """Every distribution this Python can import, canonical name -> version, sorted by name. Where a name is
    installed twice (a folder on ``PYTHONPATH`` over site-packages), the one first on ``sys.path``: the one imported."""
    found: dict[str, str] = {}
    for dist in distributions():
        metadata = dist.metadata  # each read parses the distribution's METADATA file again: once, not three times
        name, version = (metadata["Name"], metadata["Version"]) if metadata is not None else (None, None)
        if name and version is not None:
            found.setdefault(canonical_name(name), str(version))
    return dict(sorted(found.items()))


def package_differences(baseline: dict | None, current: dict | None, named: frozenset[str] = frozenset()) -> list[str]:
    """A line per package whose version differs or that only one side has: changed versions first, then the
    packages only here, then those only there, each by name. ``named``: packages already named (torch from the
    device identity). A side that recorded no packages (None: a run saved before they were) says nothing."""
    if not isinstance(baseline, dict) or not isinstance(current, dict):
        return []
    names = sorted(set(baseline) | set(current))
    changed = [f"package {n} {baseline[n]} there, {current[n]} here" for n in names
               if n in baseline and n in current and baseline[n] != current[n] and n not in named]
    here = [f"package {n} only here ({current[n]})" for n in names if n not in baseline and n not in named]
    there = [f"package {n} only there ({baseline[n]})" for n in names if n not in current and n not in named]
    return changed + here + there


def environment_differences(baseline: dict | None, current: dict | None, baseline_packages: dict | None = None,
                            packages: dict | None = None) -> list[str]:
    """What differs between two runs' software, one line each: the ``"KEY X there, Y here"`` of each
    ``ENVIRONMENT_KEYS`` entry both device identities recorded and that differs (a key one side lacks, as in runs
    recorded before it was, says nothing), then ``package_differences`` of the two sides' installed packages (a
    package an identity key already named, torch, is not named twice)."""
    keys = []
    if isinstance(baseline, dict) and isinstance(current, dict):
        keys = [key for key in ENVIRONMENT_KEYS
                if baseline.get(key) is not None and current.get(key) is not None and baseline[key] != current[key]]
    return ([f"{key} {baseline[key]} there, {current[key]} here" for key in keys]
            + package_differences(baseline_packages, packages, frozenset(keys)))
