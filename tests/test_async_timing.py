"""The timing contract on an asynchronous device (tests/async_device.py): launches return at once, only a
synchronize waits for the device, and every figure comes from the backend's clock."""

import pytest
from async_device import AsyncBackend, AsyncClock, spec

from trainbench.core.method.measure import Measurer, MeasureSettings, run_rounds
from trainbench.core.setups.recipes import TrainConfig
from trainbench.core.setups.training import InjectedFault, TrainingSetup
from trainbench.devices.device import time_with_events, timer_event_disagreement

DEVICE_S = 0.010  # device work queued by each step
SETTINGS = MeasureSettings(min_warmup_steps=2, max_warmup_steps=8, steady_window=2, rounds=3, steps_per_round=4)


def _measurer(clock, fault=None, **spec_args):
    training = TrainingSetup(TrainConfig(), spec(clock, **spec_args), AsyncBackend(clock), fault)
    return training, Measurer(training, "async-baseline", "baseline", SETTINGS)


def _timed(clock, fault=None, **spec_args):
    """The result of warm-up and timed rounds of the async spec."""
    training, m = _measurer(clock, fault, **spec_args)
    with training:
        m.warm_up()
        m.time_rounds()
    return m.result


# -- the virtual device itself ------------------------------------------------------------------------

def test_a_launch_returns_at_once_and_a_synchronize_waits_for_the_queue():
    clock = AsyncClock()
    clock.launch(0.003)
    clock.launch(0.002)
    assert clock.host == 0.0 and clock.device_idle_at == pytest.approx(0.005)
    clock.host_work(0.001)  # the host runs beside the device
    clock.synchronize()
    assert clock.host == pytest.approx(0.005)


def test_a_full_launch_queue_holds_the_host_until_the_oldest_work_is_done():
    clock = AsyncClock(queue_depth=2)
    for _ in range(3):
        clock.launch(0.010)
    assert clock.host == pytest.approx(0.010) and clock.device_idle_at == pytest.approx(0.030)


# -- round timing -----------------------------------------------------------------------------------

def test_a_round_ends_when_the_work_its_last_step_queued_is_done():
    clock = AsyncClock()
    clock.launch(0.5)  # work queued before the round (warm-up) is drained by the round's first timer read

    def step():
        clock.launch(DEVICE_S)

    times = run_rounds(step, rounds=2, steps_per_round=4, timer=AsyncBackend(clock).timer)
    # launching took no host time: without the synchronize at the round's end a round would read 0
    assert times == [pytest.approx(DEVICE_S)] * 2
    assert clock.log == ["launch"] + (["sync"] + ["launch"] * 4 + ["sync"]) * 2


def test_measured_rounds_are_the_device_time_of_their_steps_and_sync_only_at_their_boundaries():
    clock = AsyncClock()
    training, m = _measurer(clock, device_s=DEVICE_S, host_s=0.002)
    with training:
        m.warm_up()
        clock.log.clear()
        m.time_rounds()
    k = SETTINGS.steps_per_round
    assert clock.log == (["sync"] + ["launch"] * k + ["sync"]) * SETTINGS.rounds
    # the host's launch cost of 2 ms overlaps the device's 10 ms but for the first step of each round
    assert m.result.round_step_times_s == [pytest.approx(DEVICE_S + 0.002 / k)] * SETTINGS.rounds
    assert m.result.round_cpu_times_s == []  # a host that waits in a synchronize has no CPU time of the step


def test_a_host_bound_step_is_timed_by_the_host():
    result = _timed(AsyncClock(), device_s=0.001, host_s=0.004)
    # each launch waits for the 4 ms of host work; the last one's 1 ms of device work ends the round
    assert result.round_step_times_s == [pytest.approx(0.004 + 0.001 / SETTINGS.steps_per_round)] * SETTINGS.rounds


# -- the injected slowdown --------------------------------------------------------------------------

@pytest.mark.parametrize("host_s", [0.0, 0.002, 0.020])
@pytest.mark.parametrize("fraction", [0.1, 0.5])
def test_the_injected_slowdown_slows_the_measured_step_by_at_least_its_fraction(host_s, fraction):
    plain = _timed(AsyncClock(), device_s=DEVICE_S, host_s=host_s).step_time_s
    slowed = _timed(AsyncClock(), InjectedFault(slowdown=fraction), device_s=DEVICE_S, host_s=host_s).step_time_s
    # the host's hold is a fraction of the whole step, device work included: not of the launches alone
    assert slowed >= (1 + fraction) * plain - 1e-12


# -- the timer-vs-events self-check of the GPU smoke run --------------------------------------------

def _kernel_timed_with_events(clock, timer, seconds=0.020, launch_s=20e-6):
    def kernel():
        clock.host_work(launch_s)
        clock.launch(seconds)

    return time_with_events(timer, clock.record_event, lambda start, end: end - start, kernel)


def test_the_round_timer_agrees_with_events_on_an_async_device():
    clock = AsyncClock()
    clock.launch(0.100)  # earlier work still queued: the timer's first synchronize keeps it out
    timer_s, event_s = _kernel_timed_with_events(clock, AsyncBackend(clock).timer)
    # the kernel's launch lies between the two events, as on a GPU: both see it
    assert event_s == pytest.approx(0.020 + 20e-6)
    assert timer_s == pytest.approx(event_s)
    assert timer_event_disagreement(timer_s, event_s) is None


@pytest.mark.parametrize("missing_sync", ["start", "end"])
def test_the_self_check_catches_a_timer_that_does_not_wait_for_the_device(missing_sync):
    clock = AsyncClock()
    clock.launch(0.100)
    backend = AsyncBackend(clock)
    reads = iter([backend.clock, backend.timer] if missing_sync == "start" else [backend.timer, backend.clock])
    timer_s, event_s = _kernel_timed_with_events(clock, lambda: next(reads)())
    # no sync at the start counts the queued 100 ms; none at the end only the launch
    assert timer_s == pytest.approx(0.120 if missing_sync == "start" else 20e-6)
    assert "timer" in timer_event_disagreement(timer_s, event_s)


def test_the_self_check_bound_is_five_percent_plus_half_a_millisecond():
    assert timer_event_disagreement(0.0215, 0.020) is None
    assert timer_event_disagreement(0.0216, 0.020) == "timer 21.600 ms, events 20.000 ms"
    assert timer_event_disagreement(0.001, 0.0) is not None


# -- the data-wait share ----------------------------------------------------------------------------

def test_loading_that_overlaps_the_device_work_is_no_data_wait():
    # workers need 6 ms a batch, the device 10 ms a step: with the launch queue full the host is paced by the
    # device, and each batch is ready before the host asks for it
    result = _timed(AsyncClock(queue_depth=1), device_s=DEVICE_S, loader_period_s=0.006)
    assert result.step_time_s == pytest.approx(DEVICE_S)
    assert result.metrics()["data_wait_fraction"] == pytest.approx(0.0)


def test_a_loader_slower_than_the_device_shows_as_data_wait():
    # 25 ms a batch against 10 ms of device work: the device idles 15 ms of each step, the host waits in the loader
    result = _timed(AsyncClock(queue_depth=1), device_s=DEVICE_S, loader_period_s=0.025)
    assert result.step_time_s == pytest.approx(0.025, rel=0.1)
    assert result.metrics()["data_wait_fraction"] >= (0.025 - DEVICE_S) / 0.025
    assert result.metrics()["data_wait_fraction"] <= 1.0


def test_a_host_running_ahead_of_the_device_counts_its_wait_in_the_loader_although_the_device_is_busy():
    # a launch queue deep enough for the whole round: the host issues steps as fast as batches come (6 ms) while the
    # device needs 10 ms each; the host's wait in next(loader) is host time, not device idle time
    result = _timed(AsyncClock(), device_s=DEVICE_S, loader_period_s=0.006)
    assert result.step_time_s == pytest.approx(DEVICE_S)
    assert result.metrics()["data_wait_fraction"] > 0.2


def test_the_injected_slowdown_hides_behind_a_loader_slower_than_the_device():
    # the loader's wait is outside the step whose fraction is held: the hold fits in the time the host waits anyway
    plain = _timed(AsyncClock(queue_depth=1), device_s=DEVICE_S, loader_period_s=0.025).step_time_s
    slowed = _timed(AsyncClock(queue_depth=1), InjectedFault(slowdown=0.5), device_s=DEVICE_S,
                    loader_period_s=0.025).step_time_s
    assert slowed == pytest.approx(plain)
