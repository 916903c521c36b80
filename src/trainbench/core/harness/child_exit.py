"""How a process trainbench starts (a rank, a fresh-process measurement, an A/B side) ends once its work is written.

It leaves as multiprocessing's children do: Python's own exit handlers run (e.g. torch.compile's worker pool
shuts down), the standard streams are flushed, then ``os._exit`` skips the interpreter's teardown and native
static destructors. Those have aborted finished ranks ("terminate called without an active exception": a profiler
thread still joinable at exit) and failed complete jobs, and tearing down an interpreter that imported torch
takes about half a second of CPU that no answer waits for.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn


def exit_without_teardown(code: int = 0) -> NoReturn:
    """End this process with ``code`` after its exit handlers, without the interpreter's teardown."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
