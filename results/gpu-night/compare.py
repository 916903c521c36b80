"""Set a GPU night's measured cases beside the simulation that planned them: per case, the roofline's lower
bound on the step beside the measured median step, the plan's predicted tensor peak (made on a CPU with fake
tensors at the GPU profile's sizes, the memory gate's headroom taken off) beside the measured
``torch.cuda.max_memory_allocated`` and the tensor peak the session tracked on the GPU itself, and the case's
seconds as the plan's model predicts them from the night's other cases (``night_plan.predict_seconds`` with the
case itself left out of the run) beside the seconds it took.

    .venv/bin/python results/gpu-night/compare.py results/gpu-night/nvidia-h200-2026-11-28 [PLAN.json]

writes DIR/compare.md, against DIR/plan.json (the plan made before the night) or PLAN.json (one made since, e.g.
with each case's own predicted peak, which plans before 2026-11-28b do not carry). A step more than 2x its bound, or a measured peak more than 5% off the prediction, is
flagged; why is told in results/gpu-night/README.md.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

TIME_FLAG, MEMORY_FLAG = 2.0, 0.05


def main(folder: Path, plan_path: Path | None = None) -> None:
    from trainbench.jobs.night_plan import planned_peak_mib

    run = json.loads((folder / "run.json").read_text())
    plan_path = plan_path or folder / "plan.json"  # made before the night
    plan = {c["case"]: c for c in json.loads(plan_path.read_text())["cases"]}
    order = re.findall(r'name="test_(?:recipe|ladder)\[([^\]]+)\]"', (folder / "groups" / "cases.xml").read_text())
    records = {b["extra_info"]["case"]: b["extra_info"] for b in run["benchmarks"]}
    modelled = _left_out_predictions(folder, run, plan)
    rows, time_flags, memory_flags = [], 0, 0
    for position, case in enumerate([c for c in order if c in records], 1):
        info, planned = records[case], plan.get(case, {})
        step_ms = info["step_time_ms"]
        bound_ms = planned.get("bound_s") and planned["bound_s"] * 1000
        ratio = step_ms / bound_ms if bound_ms else None
        predicted = planned_peak_mib(planned)
        peak, tracked = info.get("peak_memory_mib"), info.get("tracked_peak_mib")
        off = peak / predicted - 1 if peak and predicted else None
        time_flags += bool(ratio and ratio > TIME_FLAG)
        memory_flags += bool(off is not None and abs(off) > MEMORY_FLAG)
        took = (info.get("phase_seconds") or {}).get("total")
        rows.append(f"| {position} | {case} | {_n(modelled.get(case), '.1f')} | {_n(took, '.1f')} "
                    f"| {step_ms:.1f} | {_n(bound_ms, '.1f')} | {_n(ratio, '.2f')}"
                    f"{' **>2x**' if ratio and ratio > TIME_FLAG else ''} | {_n(predicted, '.0f')} | {_n(tracked, '.0f')}"
                    f" | {_n(peak, '.0f')} | {_n(off and off * 100, '+.0f')}{'%' if off is not None else ''}"
                    f"{' **>5%**' if off is not None and abs(off) > MEMORY_FLAG else ''} |")
    lines = [f"# {folder.name}: measured against the simulation", "",
             f"The plan: `{plan_path.as_posix()}`.", "",
             f"{len(rows)} measured cases, in the order the night ran them; {time_flags} steps more than "
             f"{TIME_FLAG:g}x the roofline's bound, {memory_flags} peaks more than {MEMORY_FLAG:.0%} off the "
             "prediction. Why: [README.md](README.md).", "",
             _seconds_line(modelled, records), "",
             "Predicted s: the plan's model of the case's seconds from the night's other cases (the median cost of the "
             "cases measured as it is, beside their timed rounds, plus its steps at the roofline's bound); case s: what "
             "it took (its cost ledger's total).", "",
             "| # | case | predicted s | case s | step ms | roofline >= ms | x bound | predicted MiB | "
             "tracked MiB (GPU) | max_memory_allocated MiB | vs predicted |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|", *rows]
    (folder / "compare.md").write_text("\n".join(lines) + "\n")
    print(folder / "compare.md")


def _seconds_line(modelled: dict[str, float], records: dict[str, dict]) -> str:
    """How well the model of a case's seconds did over the cases it predicted."""
    import statistics

    pairs = [(modelled[c], records[c]["phase_seconds"]["total"]) for c in modelled]
    if not pairs:
        return "No case's seconds could be modelled."
    ratios = [p / m for p, m in pairs]
    within = sum(0.5 <= r <= 2 for r in ratios)
    return (f"Seconds: the model predicted {len(pairs)} cases at {sum(p for p, _ in pairs):.0f} s in all against "
            f"{sum(m for _, m in pairs):.0f} s measured; predicted/measured median {statistics.median(ratios):.2f} "
            f"(range {min(ratios):.2f}-{max(ratios):.2f}), within 2x for {within} of {len(pairs)}.")


def _left_out_predictions(folder: Path, run: dict, plan: dict) -> dict[str, float]:
    """Each measured case's seconds as ``predict_seconds`` models them with the case left out of the run."""
    from dataclasses import fields

    from trainbench.jobs.night_plan import PlannedCase, predict_seconds
    from trainbench.verdicts.store import SavedRun

    names = {f.name for f in fields(PlannedCase)}
    cases = [PlannedCase(**{k: tuple(map(tuple, v)) if k == "mfu_peaks" else v for k, v in c.items() if k in names})
             for c in plan.values()]
    modelled = {}
    for bench in run["benchmarks"]:
        case = bench["extra_info"]["case"]
        others = dict(run, benchmarks=[b for b in run["benchmarks"] if b is not bench])
        predicted = {c.case: c.predicted_s for c in predict_seconds(cases, SavedRun(folder / "run.json", others))}
        if predicted.get(case) is not None:
            modelled[case] = predicted[case]
    return modelled


def _n(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
