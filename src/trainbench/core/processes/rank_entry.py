"""``python -m trainbench.core.processes.rank_entry JOB_DIR``: one rank of a job (``trainbench.core.method.distributed``).

torchrun starts it once per rank (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` in the environment);
a fresh-process measurement starts it once, without them. Kept apart from ``distributed`` so that
``-m`` does not run that module a second time as ``__main__``.
"""

import sys
import traceback

from trainbench.core.harness.child_exit import exit_without_teardown
from trainbench.core.method.distributed import run_rank

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m trainbench.core.processes.rank_entry JOB_DIR (a folder holding job.json)")
    try:
        run_rank(sys.argv[1])
    except Exception:  # noqa: BLE001 - reported as Python reports it, with its exit status
        # A failed rank ends as a finished one does: its traceback (in its stream and ``rankN.err``) is all that is
        # left to say, and tearing down an interpreter that imported torch costs half a second of CPU, a second and
        # more with the training modules.
        traceback.print_exc()
        exit_without_teardown(1)
    # The job's files are written and its process group destroyed (``child_exit``: no teardown to abort the rank).
    exit_without_teardown(0)
