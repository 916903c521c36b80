"""``python -m trainbench.core.processes.ab_worker``: one side of an A/B run (``trainbench.jobs.ab``), in that side's Python.

It reads one JSON command per line on stdin and answers one JSON line on stdout; everything
else the process prints (torch's warnings, a user's print) goes to stderr, so the protocol
stays clean. Commands: ``hello`` (torch's and the device's identity, and the installed packages),
``build`` (the case, then its warm-up), ``round`` (one timed round), ``profile`` (a profiled step,
after the rounds: where the step's time goes), ``finish`` (the memory and work passes: the Result),
``losses`` (the loss guard's trajectory), ``close``. An error answers ``{"error": traceback}`` and
the worker goes on. While a command makes progress, ``{"progress": true}`` lines come before its
answer (the runner waits only as long as a side is silent); the first line to ``hello`` is one that
also says the worker's protocol and trainbench version, before anything heavy loads, so that a side
the runner refuses for them is stopped at once.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from contextlib import contextmanager

import trainbench
from trainbench.core.harness.child_exit import exit_without_teardown
from trainbench.core.harness.watchdog import watch

PROTOCOL = 5  # 2: round takes rewarm_steps; 3: round answers cpu_time_s, snapshot; 4: profile; 5: progress lines


@contextmanager
def _progress_lines(protocol, watchdog):
    """While a command runs, a ``{"progress": true}`` line every quarter of the limit in which the case made progress:
    the runner waits for an answer only as long as the side is silent (``ab_transport.SILENCE_FACTOR``)."""
    if watchdog is None:
        yield
        return
    stop = threading.Event()

    def tell():
        seen = watchdog.last_beat
        while not stop.wait(watchdog.limit_s / 4):
            if watchdog.suspended or watchdog.last_beat != seen:  # waiting on child processes is no silence
                seen = watchdog.last_beat
                protocol.write(json.dumps({"progress": True}) + "\n")

    thread = threading.Thread(target=tell, daemon=True, name="trainbench-ab-progress")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()  # before the answer is written: one line at a time


def _worker():
    """The side's measuring half (``ab_side.Worker``)."""
    # Lazy: torch and a user's spec load after stdout is the protocol's alone, and inside a command, whose error the
    # runner is told (a side whose torch cannot load says why).
    from trainbench.core.processes.ab_side import Worker

    return Worker(PROTOCOL)


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)  # our answers only
    os.dup2(2, 1)  # anything else printed goes to stderr
    worker = None
    for line in sys.stdin:
        request = json.loads(line)
        command = request.pop("command")
        if command == "close":
            break
        if command == "hello":  # who answers, before torch loads; a progress line to a runner that does not ask
            protocol.write(json.dumps({"progress": True, "protocol": PROTOCOL, "trainbench": trainbench.__version__}) + "\n")
        try:
            worker = worker or _worker()
            limit = request.get("settings", {}).get("no_progress_s") if command == "build" else worker.no_progress_s
            with watch(limit) as watchdog, _progress_lines(protocol, watchdog):  # a hung dataset or lock fails the
                answer = getattr(worker, command)(**request)                     # command, not the A/B session
        except Exception:  # noqa: BLE001 - any failure of the side is reported to the runner, which names the side
            answer = {"error": traceback.format_exc()}
        protocol.write(json.dumps(answer) + "\n")
    if worker is not None:  # a case closed before its finish: its loader's workers end with it
        worker.close_case()
    protocol.close()
    exit_without_teardown(0)


if __name__ == "__main__":
    main()
