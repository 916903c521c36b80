"""A per-case progress watchdog: a case that stops making progress fails alone, and the session goes on.

The measured code reports progress (``beat``: each training step and each batch fetched) and
names what it is doing (``phase``). A watcher thread checks that the last beat is recent; after
``limit_s`` without one it sends SIGALRM to the main thread, whose handler raises ``NoProgress``
there: a dataset item that never returns, a lock never released or a hung collective's Python
wait ends with "no progress for N s in <phase>". A signal, not a flag, because a blocking wait
(sleep, a lock, a socket) is woken only by a signal. Code stuck inside one C call that ignores
signals cannot be interrupted this way; DDP ranks bound their collectives with the process
group's own timeout, and the rank launcher has a deadline.

Another SIGALRM user (pytest-timeout's signal method) keeps working: an alarm the watchdog did
not send goes to the handler that was there before.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class NoProgress(Exception):
    """The watched code made no progress for the limit."""

    def __init__(self, seconds: float, phase: str):
        super().__init__(f"no progress for {seconds:g} s in {phase}")
        self.seconds, self.phase = seconds, phase


class Watchdog:
    def __init__(self, limit_s: float, clock=time.monotonic):
        self.limit_s = limit_s
        self.clock = clock
        self.phase = "setting up the case"
        self.last_beat = clock()
        self.suspended = 0
        self.fired = False
        self.closing = False  # the watched code is done: a late alarm is dropped
        self._stop = threading.Event()

    def beat(self) -> None:
        self.last_beat = self.clock()

    def overdue(self) -> bool:
        """No beat within the limit (and not suspended): time to interrupt."""
        return not self.suspended and not self.fired and self.clock() - self.last_beat > self.limit_s

    def _watch(self, main_thread_id: int) -> None:
        poll = min(1.0, self.limit_s / 4)
        while not self._stop.wait(poll):
            if self.overdue():
                self.fired = True
                signal.pthread_kill(main_thread_id, signal.SIGALRM)
                return


_current: Watchdog | None = None


def beat() -> None:
    """Progress: a step ran, a batch arrived. Free when no watchdog runs."""
    if _current is not None:
        _current.beat()


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Name what the case is doing, for the message; entering a phase is progress too."""
    if _current is None:
        yield
        return
    watchdog, previous = _current, _current.phase
    watchdog.phase = name
    watchdog.beat()
    try:
        yield
    finally:
        watchdog.phase = previous


@contextmanager
def suspended() -> Iterator[None]:
    """No limit while waiting on child processes: they run their own watchdogs and the launcher its deadline."""
    if _current is None:
        yield
        return
    _current.suspended += 1
    try:
        yield
    finally:
        _current.suspended -= 1
        _current.beat()


@contextmanager
def watch(limit_s: float | None) -> Iterator[Watchdog | None]:
    """Watch the code inside for progress; ``limit_s`` None or 0, or not on the main thread: no watchdog."""
    global _current
    if not limit_s or threading.current_thread() is not threading.main_thread() or _current is not None:
        yield None
        return
    watchdog = Watchdog(limit_s)

    def on_alarm(signum, frame):
        if watchdog.fired and not watchdog.closing:
            raise NoProgress(watchdog.limit_s, watchdog.phase)
        if callable(previous):  # not ours: e.g. pytest-timeout's alarm
            previous(signum, frame)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    watcher = threading.Thread(target=watchdog._watch, args=(threading.main_thread().ident,), daemon=True,
                               name="trainbench-watchdog")
    _current = watchdog
    watcher.start()
    try:
        yield watchdog
    finally:
        watchdog.closing = True
        _current = None
        watchdog._stop.set()
        watcher.join()
        signal.signal(signal.SIGALRM, previous)
