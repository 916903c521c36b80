"""The progress watchdog: a wait that never ends is interrupted, progress keeps it quiet, others' alarms pass."""

import signal
import threading
import time

import pytest

from trainbench.core.harness.watchdog import NoProgress, beat, phase, suspended, watch


def test_a_wait_that_never_returns_is_interrupted_naming_the_phase():
    started = time.monotonic()
    with pytest.raises(NoProgress, match=r"no progress for 0.5 s in loading the batch"), watch(0.5), phase("loading the batch"):
        threading.Event().wait(60)  # a stuck lock or read: only a signal wakes it
    assert time.monotonic() - started < 30  # far below the 60 s wait, whatever the load


def test_progress_keeps_the_watchdog_quiet_and_suspension_pauses_it():
    with watch(0.5) as watchdog:
        for _ in range(8):
            time.sleep(0.1)
            beat()
        with suspended():
            assert not watchdog.overdue()
            watchdog.last_beat -= 10  # long past the limit: still not overdue while suspended
            assert not watchdog.overdue()
        assert not watchdog.fired


def test_without_a_limit_nothing_is_watched():
    with watch(0) as watchdog:
        assert watchdog is None
        beat()  # free and harmless


def test_an_alarm_the_watchdog_did_not_send_goes_to_the_handler_that_was_there():
    seen = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: seen.append(signum))
    try:
        with watch(30):
            signal.raise_signal(signal.SIGALRM)  # e.g. pytest-timeout's own alarm
        assert seen == [signal.SIGALRM]
        assert signal.getsignal(signal.SIGALRM) is not None and signal.getsignal(signal.SIGALRM)(0, None) is None
    finally:
        signal.signal(signal.SIGALRM, previous)
