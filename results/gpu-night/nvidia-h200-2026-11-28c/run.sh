#!/bin/bash
# The third call of the 2026-11-28 window (346 s of device time left): the two GPU self-checks the capped smoke
# steps never reached, the two CUDA paths no case measures, then ladder003's rungs 3-7 (batch 512/1024, uint8,
# set_to_none, AMP, torch.compile) under the night's window profile. Everything it writes goes to $OUT.
set -o pipefail
python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . 2>&1 | tail -3
export PYTHONUNBUFFERED=1 TRAINBENCH_PREDICTIONS_FILE=/tmp/predictions.json TRAINBENCH_IGNORE_DOCTOR=1
date -u +%FT%TZ
timeout -s INT -k 10 85 python3 -m pytest -rs -p no:cacheprovider --junitxml "$OUT/smoke.xml" \
  smoke/test_gpu_smoke.py -k "predicted_memory or attribution or transformer-amp_fp16 or gpt-amp_fp16" \
  2>&1 | tee "$OUT/smoke.log" | tail -15
date -u +%FT%TZ
rungs=()
for r in 3_larger_batch 4_uint8_transfer 5_set_to_none 6_amp 7_compile; do
  rungs+=("benchmarks/test_recipes.py::test_ladder[resnet18-ladder003-$r]")
done
timeout -s INT -k 10 125 python3 -m pytest -rs -p no:cacheprovider --trainbench-device=cuda --trainbench-slow \
  --trainbench-costs --trainbench-rounds=10 --trainbench-steps-per-round=5 --trainbench-min-warmup=5 \
  --trainbench-no-attribution --trainbench-save-progress "$OUT/ladder.progress.json" \
  --benchmark-json "$OUT/ladder.json" --junitxml "$OUT/ladder.xml" "${rungs[@]}" 2>&1 | tee "$OUT/ladder.log" | tail -25
date -u +%FT%TZ
