"""The night's steps as child processes: each in its own process group, its output into its log, stopped at its
deadline (SIGINT, then SIGTERM, then SIGKILL) so that a pytest session reports and saves what it measured."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# After SIGINT, how long a step may take to save what it measured before it is sent SIGTERM, and then SIGKILL.
TERM_GRACE_S = 15.0
KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class StepOutcome:
    exit_code: int | None  # None: it never started
    stopped: bool = False  # it ran past its deadline and was stopped


# A step's command runs as (argv, log file, deadline on the night's clock) -> outcome.
StepRunner = Callable[[list[str], Path, float], StepOutcome]


def subprocess_runner(clock: Callable[[], float] = time.monotonic, env: dict[str, str] | None = None) -> StepRunner:
    """Run a step as a child process in its own process group, its output into its log; stopped at the deadline.
    ``env``: variables the children get beside this process's."""

    def run(argv: list[str], log: Path, deadline: float) -> StepOutcome:
        env_here = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        with open(log, "wb") as out:
            child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env_here,
                                     start_new_session=True, preexec_fn=_interruptible)
            try:
                return _wait(child, deadline, clock)
            except BaseException:
                _stop(child)
                raise

    return run


def _interruptible() -> None:
    """In the child before it starts: SIGINT back to its default, so that Python makes it a KeyboardInterrupt. A
    night started in the background of a shell script inherits SIGINT ignored, and its steps would then sit out the
    deadline's SIGINT and lose their report to the SIGTERM after it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait(child: subprocess.Popen, deadline: float, clock: Callable[[], float]) -> StepOutcome:
    while True:
        left = deadline - clock()
        try:
            return StepOutcome(child.wait(timeout=max(0.05, min(left, 1.0))))
        except subprocess.TimeoutExpired:
            if clock() >= deadline:
                return StepOutcome(_stop(child), stopped=True)


def _stop(child: subprocess.Popen) -> int:
    """SIGINT to the step's process group first (pytest ends as on Ctrl-C: it reports the failures so far and writes
    its JUnit XML, and a trainbench session saves what it measured), SIGTERM after ``TERM_GRACE_S``, SIGKILL after
    ``KILL_GRACE_S`` more."""
    for sig, wait in ((signal.SIGINT, TERM_GRACE_S), (signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return child.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return child.wait()
