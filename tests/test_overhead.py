"""The harness must not distort what it measures.

samples/s reported by the harness for a plain recipe is compared with a bare
hand-written loop over the same step on the same live iterator. Repetitions are
interleaved (alternating which goes first) in one process and the median ratio is
used, which is robust to this shared machine's drift and bursts of noise.
"""

import statistics
import time

from trainbench.measure import Measurement, MeasureSettings
from trainbench.recipes import TrainConfig
from trainbench.step import Training

REPETITIONS = 41  # pairs of adjacent rounds
ROUNDS, STEPS_PER_ROUND = 1, 20


# Quiet runs measure medians of 0.986-1.04; single pairs on this shared 2-core machine spread 0.75-1.6,
# and the median of 41 moved by 4% on a fresh clone. 10% is beyond what load moves the median, and well
# below what a real harness cost would show on this ~1 ms step (a dispatch mode left on in the timed
# path, a per-step sync, an extra copy of the batch).
MARGIN = 0.10


def test_harness_overhead_is_within_10_percent_of_a_bare_loop(cpu, mlp):
    settings = MeasureSettings(min_warmup_steps=20, max_warmup_steps=20, rounds=ROUNDS,
                               steps_per_round=STEPS_PER_ROUND, breakdown=False, work=False)
    with Training(TrainConfig(zero_grad="set_to_none"), mlp, cpu) as training:
        batches = training.batches()
        harness = Measurement(training, "mlp-baseline", "baseline", settings)
        harness.warm_up()

        def harness_rate():
            harness.time_rounds()
            return harness.result.samples_per_s

        def bare_rate():
            n = ROUNDS * STEPS_PER_ROUND
            start = time.perf_counter()
            for _ in range(n):
                training.step(training.fetch(batches))
            return n * training.batch_size / (time.perf_counter() - start)

        ratios = []
        for rep in range(REPETITIONS):
            if rep % 2:
                bare = bare_rate()
                measured = harness_rate()
            else:
                measured = harness_rate()
                bare = bare_rate()
            ratios.append(measured / bare)

    median = statistics.median(ratios)
    print(f"harness/bare samples/s: median {median:.4f}, all {[round(r, 3) for r in ratios]}")
    assert 1 - MARGIN <= median <= 1 + MARGIN, f"harness reports {median:.3f}x a bare loop (ratios {ratios})"
