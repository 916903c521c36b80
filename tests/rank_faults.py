"""A training spec whose module plants a fault in the processes that import it, where an environment variable says so.

Rank and fresh processes import a user's spec module before the job's process group and training modules
(``distributed.import_spec_module``): a fault planted here strikes as such a process starts, so a job that fails
costs little more than its interpreters' start-up. ``TRAINBENCH_TEST_FAULT``:

- ``raise``: a Python error, as a spec module that cannot be imported on a node raises;
- ``abort``: a native crash (no Python traceback, as a C++ abort in a collective leaves), in every process;
- ``abort_once:PATH``: the process that creates the file PATH first aborts; the others, and those of a relaunched
  job, run on, in processes whose native teardown would abort them once their work is done (as a static destructor
  finding a thread still joinable does): abort() registered the way C++ registers static destructors.

The test process imports this module before it sets the variable: the fault is its children's alone.
"""

import ctypes
import dataclasses
import os

from trainbench.core.setups.workloads import PROFILES, resolve_spec

FAULT = "TRAINBENCH_TEST_FAULT"


def _plant(fault: str) -> None:
    kind, _, marker = fault.partition(":")
    if kind == "raise":
        raise RuntimeError("a fault planted in this process")
    if kind == "abort_once":
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            libc = ctypes.CDLL(None)
            libc.__cxa_atexit(ctypes.cast(libc.abort, ctypes.c_void_p), None, None)
            return
    elif kind != "abort":
        raise ValueError(f"{FAULT}={fault!r}: expected raise, abort or abort_once:PATH")
    os.abort()


if os.environ.get(FAULT):
    _plant(os.environ[FAULT])


def _mlp():
    return resolve_spec("mlp", PROFILES["cpu"]).model()


# Its model defined here: the processes find the spec by this module's name for it, and import nothing else.
MLP = dataclasses.replace(resolve_spec("mlp", PROFILES["cpu"]), name="mlp_with_a_planted_fault", model=_mlp)
