"""asv benchmarks: the pytest suite's cases (trainbench.core.setups.cases), tracked across commits and PyTorch versions.

asv runs ``setup_cache`` once per environment: it measures every case with the same runner
as the pytest plugin (warm-up, synchronized rounds, interleaved baselines where a ratio
budget asks, memory and work passes, correctness guards). Each ``track_*`` then reports one
metric of ``trainbench.core.records.metrics.METRICS`` for one case, in the unit asv shows, grouped as the
metric says: ``Speed`` (timing), ``Memory`` and ``Work`` (exact signals, the ones a shared CPU
runner can gate on). Cases this device cannot run (GPU-only, several GPUs) are skipped; so
are slow ones unless TRAINBENCH_ASV_SLOW=1. TRAINBENCH_ASV_CASES (a regex) limits the cases
measured; TRAINBENCH_ASV_TIMEOUT (seconds, default 7200) bounds the one measurement of them all.
A metric this device does not produce (CUDA kernels on CPU) is n/a for that track; a case whose
correctness guard failed fails its tracks.
"""

from pathlib import Path

from asv_runner.benchmarks.mark import SkipNotImplemented

from trainbench.core.method.asv_suite import cache_timeout_s, case_ids, measure_all
from trainbench.core.records.metrics import METRICS, metrics_in
from trainbench.core.records.result import CaseRecord

BUDGETS = Path(__file__).parent / "budgets.toml"
# asv units: bytes and seconds where asv formats them, from the metric's own unit.
UNITS = {"MiB": ("bytes", 2**20), "ms": ("seconds", 1e-3), "s": ("seconds", 1.0), "B": ("bytes", 1.0)}
# Track names kept from the first recorded history (asv keys its results by them).
TRACK_NAMES = {"step_time_ms": "step_time", "first_step_s": "first_step_time", "peak_memory_mib": "peak_memory",
               "peak_reserved_mib": "peak_reserved_memory", "tracked_peak_mib": "tracked_peak_memory",
               "param_mib": "param_memory", "grad_mib": "grad_memory", "optimizer_state_mib": "optimizer_state_memory",
               "activation_mib": "activation_memory", "temporary_mib": "temporary_memory",
               "memory_growth_mib_per_step": "memory_growth_per_step"}


def _track(metric: str):
    """A track_* method reporting ``metric`` of the case, in asv's unit for it."""
    unit, scale = UNITS.get(METRICS[metric].unit, (METRICS[metric].unit or "count", 1.0))

    def track(self, cache, case):
        value = self.metrics.get(metric)
        if value is None:
            raise SkipNotImplemented(f"{case}: this device does not measure {metric}")
        return value * scale

    track.unit = unit
    track.metric = metric  # which trainbench metric this track reports (for tests and readers)
    return track


def _tracks(group: str) -> dict:
    return {f"track_{TRACK_NAMES.get(name, name)}": _track(name) for name in metrics_in(group)}


class _Cases:
    """The cases as asv parameters, measured once per environment (one ``setup_cache`` shared by
    the subclasses: asv keys the cache by the function, which they inherit)."""

    # asv's parametrization protocol: plain class attributes it reads at discovery.
    params = [case_ids()]  # noqa: RUF012
    param_names = ["case"]  # noqa: RUF012
    timeout = 120  # each track only reads the cache
    # What a track means: asv keeps results only while this matches (by default it hashes this file's code, so
    # any change of the plumbing would orphan the history across PyTorch versions). Change it when the meaning
    # of a metric or the measurement method changes, never for a refactor.
    version = "trainbench-method-1"

    def setup_cache(self):
        return measure_all(budgets_path=BUDGETS)

    # The whole suite, measured once: when it runs out of time every track fails (asv exits 2).
    setup_cache.timeout = cache_timeout_s()

    def setup(self, cache, case):
        entry = cache[case]
        if "skip" in entry:
            raise NotImplementedError(entry["skip"])  # asv: skipped, shown as n/a
        if "error" in entry:
            raise RuntimeError(entry["error"])  # asv: failed (out of memory, a hung loader)
        record = CaseRecord.read(entry["record"], case)
        if record.guard_failures:
            raise RuntimeError("; ".join(record.guard_failures))  # asv: failed (a correctness guard)
        self.metrics = record.metrics


# Speed: noisy on shared runners; gate it on a quiet, dedicated machine. asv takes every track as
# lower-is-better (airspeed-velocity/asv#1617), so it reads a fall in samples/s as an improvement:
# samples/s is here to read, step time is what to gate.
Speed = type("Speed", (_Cases,), {"__doc__": "Timing: gate on a quiet machine.", **_tracks("speed")})
# Memory: the device's peak (CUDA allocator, or the tracked tensor peak on CPU; not asv's host RSS),
# what it is made of, and growth per step. Exact on CPU; allocator peaks are stable on GPUs.
Memory = type("Memory", (_Cases,), {"__doc__": "Memory peaks, their parts and growth.", **_tracks("memory")})
# Work: what a step does, exact functions of the code and shapes, so any change is real.
Work = type("Work", (_Cases,), {"__doc__": "FLOPs, bytes, ops, calls, syncs and kernels.", **_tracks("work")})
