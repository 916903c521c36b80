"""The timed bisect on planted repositories, many times: ``python results/bisect/planted.py RUNS OUT_DIR``.

Each run builds the eight-commit user project of tests/test_bisect.py with its step slowed (two extra matrix
products and a tanh a forward) at commit 2 + seed % 7, and runs ``python -m trainbench bisect`` by step_time_ms
(10% threshold, A/B with 5 steps a round, 20 s of measuring again). It prints one line a run: the planted commit,
what the search said, its steps and seconds; and a last line with the counts (found / could not tell / wrong).
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import test_bisect as planted  # noqa: E402


def main(runs: int, out: Path) -> int:
    counts = {"found": 0, "could not tell": 0, "wrong": 0}
    for seed in range(1, runs + 1):
        at = 2 + seed % 7
        root = out / f"seed{seed}"
        shas = planted._planted_repo(root, change=(2, 2), planted_at=at)
        started = time.monotonic()
        done = planted._bisect(root, shas[0], shas[-1], "--metric=step_time_ms", "--threshold=10%",
                               "--remeasure-s=20", "--pytest-arg=--trainbench-min-warmup=1",
                               "--pytest-arg=--trainbench-steps-per-round=5", "--json", str(root / "answer.json"))
        answer = json.loads((root / "answer.json").read_text()) if (root / "answer.json").exists() else {}
        first = (answer.get("first_bad") or {}).get("sha")
        if done.returncode == 0 and first == shas[at - 1]:
            outcome = "found"
        elif done.returncode == 1 and first is None and (not answer or shas[at - 1] in answer.get("open", [])):
            outcome = "could not tell"
        else:
            outcome = "wrong"
        counts[outcome] += 1
        print(f"seed {seed}: planted at commit {at}: {outcome} ({len(answer.get('steps', []))} steps, "
              f"{time.monotonic() - started:.0f} s): {done.stdout.strip().splitlines()[-1]}", flush=True)
    print(f"{runs} runs: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return 1 if counts["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), Path(sys.argv[2])))
