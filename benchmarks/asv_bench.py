"""asv benchmarks: the pytest suite's cases (trainbench.cases), tracked across commits and PyTorch versions.

asv runs ``setup_cache`` once per environment: it measures every case with the same
method as the pytest plugin (warm-up, synchronized rounds, memory and work passes).
Each ``track_*`` then reports one number of one case from that cache, with its unit.
Cases this device cannot run (GPU-only, several GPUs) are skipped; so are slow ones
unless TRAINBENCH_ASV_SLOW=1. TRAINBENCH_ASV_CASES (a regex) limits the cases measured.
"""

from trainbench.asv_suite import case_ids, measure_all

MIB = 2**20


class TrainingStep:
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

    def _metric(self, name, scale=1.0):
        value = self.metrics.get(name)
        return None if value is None else value * scale

    def track_samples_per_s(self, cache, case):
        return self._metric("samples_per_s")

    track_samples_per_s.unit = "samples/s"

    def track_step_time(self, cache, case):
        return self._metric("step_time_ms", 1e-3)

    track_step_time.unit = "seconds"

    def track_peak_memory(self, cache, case):
        # The device's peak: CUDA allocator peak, or the tracked tensor peak on CPU (not asv's host RSS).
        return self._metric("peak_memory_mib", MIB)

    track_peak_memory.unit = "bytes"

    def track_activation_memory(self, cache, case):
        return self._metric("activation_mib", MIB)

    track_activation_memory.unit = "bytes"

    def track_gflops_per_sample(self, cache, case):
        return self._metric("gflops_per_sample")

    track_gflops_per_sample.unit = "GFLOP"

    def track_ops_per_step(self, cache, case):
        return self._metric("ops_per_step")

    track_ops_per_step.unit = "ops"

    def track_syncs_per_step(self, cache, case):
        return self._metric("syncs_per_step")

    track_syncs_per_step.unit = "syncs"
