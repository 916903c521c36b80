"""A/B says where a change comes from: a slower op planted in the head's PyTorch, and a leak planted in one module.

The changes are planted in the head's process by patching PyTorch or the model (``tests/planted.py``), never by
trainbench's own fault injection, and the same interpreter runs both sides.
"""

import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from planted import GELU_NET, LEAK, LEAKY_NET, SLOW_OP_MS

from trainbench.core.method.distributed import spec_reference
from trainbench.core.setups.recipes import get_recipe
from trainbench.core.records.result import Result
from trainbench.core.setups.workloads import PROFILES
from trainbench.jobs.ab import ATTRIBUTION_PAIRS, ABCase, project_paths, run_case, start, verdict
from trainbench.verdicts.present import verdict_markdown

SETTINGS = {"min_warmup_steps": 2, "max_warmup_steps": 4, "steady_window": 2, "rounds": 3, "steps_per_round": 2,
            "memory_steps": 1}
PAIRS = 6  # the fewest whose one-sided sign test can be significant at 5% (0.5**6 = 0.016)
SLEEP_MS = 20  # per gelu call in the head: many times the tiny step itself


def _case(spec, settings=SETTINGS) -> ABCase:
    return ABCase(f"{spec.name}-baseline", "baseline", get_recipe("baseline").config(PROFILES["cpu"]).record(),
                  spec_reference(spec), "cpu", settings, threads=1, paths=project_paths(Path(__file__).parents[1]))


@pytest.fixture(scope="module")
def planted():
    """Both sides on this interpreter; the head's gelu kernel sleeps, and its ``Net.leaky`` keeps its outputs."""
    base, head, hello = start(sys.executable, sys.executable, head_env={SLOW_OP_MS: str(SLEEP_MS), LEAK: "1"})
    yield base, head, hello
    base.close()
    head.close()


def _comparison(outcome, metric):
    return next(c for c in outcome.comparisons if c.metric == metric)


def _share(line: str) -> float:
    return float(re.search(r"(\d+)% of the change", line).group(1)) / 100


def test_a_slower_op_planted_in_the_head_is_named_first_with_most_of_the_change(planted):
    base, head, hello = planted
    outcome = run_case(base, head, _case(GELU_NET), pairs=PAIRS, thresholds={"step_time_ms": 0.5})
    step = _comparison(outcome, "step_time_ms")
    assert step.verdict == "regressed", step.describe()
    first = step.explanation[0]
    assert first.startswith("op self time: aten::gelu +") and "95% CI" in first, step.explanation
    assert _share(first) > 0.5, first
    # The linear layers' ops are the same on both sides (at most their caches are cooler after the head's sleep):
    # within noise or under 2% of the change, never named.
    assert not any("aten::addmm" in line or "aten::mm " in line for line in step.explanation), step.explanation
    # A deterministic change is explained too: the head's gelu now dispatches the ops it is made of.
    calls = _comparison(outcome, "aten_calls_per_step")
    assert calls.verdict == "regressed", calls.describe()
    assert calls.explanation and all(line.startswith("profiled calls: aten::") for line in calls.explanation)
    # The verdict JSON and its Markdown carry it.
    shape = verdict([outcome], hello, gated=True).to_json()
    as_json = next(c for c in shape["comparisons"] if c["metric"] == "step_time_ms")
    assert as_json["explanation"][0] == first
    assert f"  - {first}" in verdict_markdown(shape)


def test_a_leak_planted_in_one_module_is_named_by_that_module(planted):
    base, head, hello = planted
    outcome = run_case(base, head, _case(LEAKY_NET), pairs=PAIRS, thresholds={"step_time_ms": 10.0})
    growth = _comparison(outcome, "memory_growth_mib_per_step")
    assert growth.verdict == "regressed", growth.describe()
    assert growth.explanation[0].startswith("memory kept per step by site: Net.leaky +"), growth.explanation
    lines = _terminal_summary(outcome, hello)
    assert "    " + growth.explanation[0] in lines, lines


def _terminal_summary(outcome, hello) -> list[str]:
    from trainbench.plugin.summary import write_ab

    lines = []
    reporter = SimpleNamespace(write_sep=lambda sep, title: lines.append(title),
                               write_line=lambda line, **markup: lines.append(line))
    write_ab(reporter, verdict([outcome], hello, gated=True))
    return lines


class LoggedSide:
    """A side that logs the commands it is given and answers with step times the test decides (no worker)."""

    python = "logged"

    def __init__(self, label: str, log: list, step_s: float):
        self.label, self.log, self.step_s, self.rounds = label, log, step_s, []

    def call(self, command: str, **arguments) -> dict:
        self.log.append((command, self.label, arguments.get("rewarm_steps")))
        if command == "round":
            self.rounds.append(self.step_s)
            return {"step_time_s": self.step_s, "cpu_time_s": self.step_s}
        if command == "profile":
            ms = self.step_s * 1e3
            return {"profile": {"steps": 1, "wall_ms": [ms], "ops_ms": {"aten::mm": [ms]}, "calls": {"aten::mm": 1}}}
        if command in ("snapshot", "finish"):
            return {"result": Result("mlp-baseline", "mlp", "baseline", "cpu", batch_size=16, config={}, device={},
                                     steps_per_round=2, round_step_times_s=list(self.rounds)).to_dict()}
        return {}


def test_profiled_steps_come_after_every_timed_round_in_abba_pairs_and_only_with_attribution_on():
    log = []
    outcome = run_case(LoggedSide("base", log, 0.010), LoggedSide("head", log, 0.020), _case(GELU_NET), pairs=6,
                       thresholds={"step_time_ms": 0.05})
    # Explained from the profiled pairs: every pair says +10 ms in aten::mm
    assert _comparison(outcome, "step_time_ms").explanation == (
        "op self time: aten::mm +10 ms/step (95% CI +10..+10), 100% of the change",)
    commands = [command for command, _, _ in log]
    profiles = [(label, rewarm) for command, label, rewarm in log if command == "profile"]
    assert len(profiles) == 2 * ATTRIBUTION_PAIRS
    assert [label for label, _ in profiles[:4]] == ["base", "head", "head", "base"]
    assert all(rewarm == 1 for _, rewarm in profiles)  # an untimed step first, as before a round
    last_round = max(i for i, command in enumerate(commands) if command == "round")
    first_profile, first_finish = commands.index("profile"), commands.index("finish")
    assert last_round < first_profile and max(i for i, c in enumerate(commands) if c == "profile") < first_finish
    off = []
    run_case(LoggedSide("base", off, 0.010), LoggedSide("head", off, 0.020),
             _case(GELU_NET, {**SETTINGS, "attribution": False}), pairs=4, thresholds={"step_time_ms": 0.05})
    assert "profile" not in [command for command, _, _ in off]
    same = []  # an unchanged step time has nothing to explain: no profiled pairs
    unchanged = run_case(LoggedSide("base", same, 0.010), LoggedSide("head", same, 0.010), _case(GELU_NET), pairs=6,
                         thresholds={"step_time_ms": 0.05})
    assert _comparison(unchanged, "step_time_ms").verdict == "unchanged"
    assert "profile" not in [command for command, _, _ in same]
