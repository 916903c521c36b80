"""asv benchmarks: the pytest suite's cases (trainbench.cases), tracked across commits and PyTorch versions.

asv runs ``setup_cache`` once per environment: it measures every case with the same
method as the pytest plugin (warm-up, synchronized rounds, memory and work passes).
Each ``track_*`` then reports one metric (``trainbench.result.METRICS``) of one case from
that cache, in the unit asv shows: ``Speed`` (timing), ``Memory`` and ``Work`` (exact
signals, the ones a shared CPU runner can gate on). Cases this device cannot run
(GPU-only, several GPUs) are skipped; so are slow ones unless TRAINBENCH_ASV_SLOW=1.
TRAINBENCH_ASV_CASES (a regex) limits the cases measured. A metric this device does not
produce (CUDA kernels, allocator reserve on CPU) is skipped for that track, shown as n/a.
"""

from asv_runner.benchmarks.mark import SkipNotImplemented

from trainbench.asv_suite import case_ids, measure_all

MIB = 2**20


def _track(metric: str, unit: str, scale: float = 1.0):
    """A track_* method reporting ``metric`` of the case x ``scale``, in ``unit``."""

    def track(self, cache, case):
        value = self.metrics.get(metric)
        if value is None:
            raise SkipNotImplemented(f"{case}: this device does not measure {metric}")
        return value * scale

    track.unit = unit
    track.metric = metric  # which trainbench metric this track reports (for tests and readers)
    return track


class _Cases:
    """The cases as asv parameters, measured once per environment (one ``setup_cache`` shared by
    the subclasses: asv keys the cache by the function, which they inherit)."""

    # asv's parametrization protocol: plain class attributes it reads at discovery.
    params = [case_ids()]  # noqa: RUF012
    param_names = ["case"]  # noqa: RUF012
    timeout = 120  # each track only reads the cache

    def setup_cache(self):
        return measure_all()

    setup_cache.timeout = 3600  # the whole suite, measured once

    def setup(self, cache, case):
        entry = cache[case]
        if "skip" in entry:
            raise NotImplementedError(entry["skip"])  # asv: skipped, shown as n/a
        self.metrics = entry["metrics"]


class Speed(_Cases):
    """Timing: noisy on shared runners; gate it on a quiet, dedicated machine.

    asv takes every track as lower-is-better (airspeed-velocity/asv#1617), so it reads a fall
    in samples/s as an improvement: samples/s is here to read, step time is what to gate.
    """

    track_step_time = _track("step_time_ms", "seconds", 1e-3)
    track_samples_per_s = _track("samples_per_s", "samples/s")
    track_first_step_time = _track("first_step_s", "seconds")  # compilation, autotuning, worker start-up


class Memory(_Cases):
    """The device's peak (CUDA allocator, or the tracked tensor peak on CPU; not asv's host RSS),
    what it is made of, and growth per step. Exact on CPU; allocator peaks are stable on GPUs."""

    track_peak_memory = _track("peak_memory_mib", "bytes", MIB)
    track_peak_reserved_memory = _track("peak_reserved_mib", "bytes", MIB)
    track_tracked_peak_memory = _track("tracked_peak_mib", "bytes", MIB)
    track_param_memory = _track("param_mib", "bytes", MIB)
    track_grad_memory = _track("grad_mib", "bytes", MIB)
    track_optimizer_state_memory = _track("optimizer_state_mib", "bytes", MIB)
    track_activation_memory = _track("activation_mib", "bytes", MIB)
    track_temporary_memory = _track("temporary_mib", "bytes", MIB)
    track_memory_growth_per_step = _track("memory_growth_mib_per_step", "bytes", MIB)
    track_graph_nodes_growth_per_step = _track("graph_nodes_growth_per_step", "nodes")


class Work(_Cases):
    """What a step does: exact functions of the code and shapes, so any change is real."""

    track_gflops_per_sample = _track("gflops_per_sample", "GFLOP")
    track_h2d_bytes_per_sample = _track("h2d_bytes_per_sample", "bytes")
    track_ops_per_step = _track("ops_per_step", "ops")
    track_aten_calls_per_step = _track("aten_calls_per_step", "calls")
    track_syncs_per_step = _track("syncs_per_step", "syncs")
    track_kernels_per_step = _track("kernels_per_step", "kernels")
