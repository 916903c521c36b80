"""``python -m trainbench.core.rank_entry JOB_DIR``: one rank of a job (``trainbench.core.distributed``).

torchrun starts it once per rank (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` in the environment);
a fresh-process measurement starts it once, without them. Kept apart from ``distributed`` so that
``-m`` does not run that module a second time as ``__main__``.
"""

import atexit
import os
import sys

from trainbench.core.distributed import run_rank

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m trainbench.core.rank_entry JOB_DIR (a folder holding job.json)")
    run_rank(sys.argv[1])
    # The job's files are written and its process group destroyed. A finished rank leaves as multiprocessing's
    # children do: Python's own exit handlers run (e.g. torch.compile's worker pool shuts down), then os._exit skips
    # the interpreter's teardown and native static destructors, which have aborted finished ranks ("terminate
    # called without an active exception": a profiler thread still joinable at exit) and failed complete jobs.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
