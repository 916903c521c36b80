"""What a night runs and when: its cases in the order of what they tell, its measuring profile, its budget's
reserve for finishing, and the self-checks that come first."""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass
from pathlib import Path

from trainbench.core.setups.cases import ladder_cases, recipe_cases
from trainbench.jobs.night_processes import TERM_GRACE_S

SUITE_FILE = "benchmarks/test_recipes.py"
# Time kept back from the measuring steps for keeping the run, calibrating, reporting and the summary.
FINISH_RESERVE_S = 60.0
# A step that would have less than this left is not started: it could not finish anything worth keeping.
MIN_STEP_S = 10.0


@dataclass(frozen=True)
class CaseGroup:
    """Cases measured in one pytest session, in the night's order: the first tell the most per second."""

    name: str
    why: str
    cases: tuple[str, ...] | None  # case ids; None: every suite case no earlier group took
    slow: bool = False  # torch.compile and the like: --trainbench-slow
    ladders: bool = False  # the ladder rungs (test_ladder) rather than single recipes


CASE_GROUPS: tuple[CaseGroup, ...] = (
    CaseGroup("resnet18", "the seeds' model: each CUDA data path and precision against its fp32 baseline",
              ("resnet18-baseline", "resnet18-amp_fp16", "resnet18-amp_bf16", "resnet18-channels_last_amp",
               "resnet18-uint8_transfer", "resnet18-pinned_memory", "resnet18-multiprocess_loading",
               "resnet18-cudnn_benchmark")),
    CaseGroup("gpt", "a decoder LM: flash attention and the fused optimizer",
              ("gpt-baseline", "gpt-sdpa_flash", "gpt-optimizer_fused")),
    CaseGroup("vit", "a Vision Transformer under bf16 autocast", ("vit-amp_bf16",)),
    CaseGroup("rest", "every other case of the suite that compiles nothing", None),
    CaseGroup("slow", "the cases that compile (torch.compile and the like): minutes of warm-up each", None,
              slow=True),
    CaseGroup("ladders", "the seeds' two ladders, rung by rung (torch.compile included): the slowest, last", None,
              slow=True, ladders=True),
)
# The GPU self-checks' share of the window: they come first in their step, the CUDA paths no case of the night
# measures after them.
SMOKE_CAP_S = 60.0
SMOKE_FILE = "smoke/test_gpu_smoke.py"
# The smoke tests that each run one CUDA path: those the night's own cases measure anyway are left out.
SMOKE_PATH_TESTS = ("test_cuda_path", "test_multi_gpu_path")
# Where a budget is shorter than this, the window profile trims what a case times (WindowProfile).
SHORT_NIGHT_S = 900.0


@dataclass(frozen=True)
class WindowProfile:
    """How much each case times in this night: fewer steps a round and no attribution where the budget is short
    (the rounds stay at the number whose 95% intervals keep their claim, ``stats`` and the tests of it)."""

    name: str
    why: str
    rounds: int | None = None  # None: the device profile's default
    steps_per_round: int | None = None
    min_warmup: int | None = None
    attribution: bool = True

    def pytest_args(self) -> tuple[str, ...]:
        args = [f"--trainbench-{flag}={value}" for flag, value in
                (("rounds", self.rounds), ("steps-per-round", self.steps_per_round),
                 ("min-warmup", self.min_warmup)) if value is not None]
        return (*args, *(() if self.attribution else ("--trainbench-no-attribution",)))

    def to_json(self) -> dict:
        return {**asdict(self), "pytest_args": list(self.pytest_args())}


def window_profile(budget_s: float, device: str) -> WindowProfile:
    """The measuring profile a night of ``budget_s`` seconds on ``device`` (cuda or cpu) uses."""
    if budget_s >= SHORT_NIGHT_S:
        return WindowProfile("full", f"a budget of {budget_s:g} s >= {SHORT_NIGHT_S:g} s: the device profile as is")
    why = f"a budget of {budget_s:g} s < {SHORT_NIGHT_S:g} s"
    if device == "cpu":  # ~0.1-0.3 s steps: 2 a round serve the interval better than fewer rounds of more
        return WindowProfile("short", why + ": 8 rounds of 2 steps, no attribution", rounds=8, steps_per_round=2,
                             attribution=False)
    # ms steps: the rounds cost little, the passes after them most; warm-up still runs until steady
    return WindowProfile("short", why + ": 10 rounds of 5 steps, warm-up from 5 steps, no attribution",
                         rounds=10, steps_per_round=5, min_warmup=5, attribution=False)


def least_budget_s(simulated: bool) -> float:
    """The least ``--budget-s`` a night accepts: two steps of ``MIN_STEP_S`` to measure in before its
    ``finish_reserve`` (45 s for a night on a GPU, 40 s for a rehearsal)."""
    budget = 2 * MIN_STEP_S
    while budget - finish_reserve(budget, simulated) < 2 * MIN_STEP_S:  # the reserve grows with the budget, slower
        budget = 2 * MIN_STEP_S + finish_reserve(budget, simulated)
    return budget


def finish_reserve(budget_s: float, simulated: bool) -> float:
    """Seconds kept back from measuring: for keeping the run, calibrating and reporting (a quarter of a short
    budget), or on a rehearsal, which has only its summary to write, for a stopped step to end."""
    if simulated:
        return TERM_GRACE_S + 5.0
    return max(min(FINISH_RESERVE_S, budget_s / 4), TERM_GRACE_S + MIN_STEP_S)


def suite_node_ids(group: CaseGroup, taken: set[str]) -> list[str]:
    """The pytest node ids of ``group``'s cases in its order (``taken``: ids earlier groups ran, updated). A group
    of every case left takes those whose slowness is its own (the cheap ones first, those that compile after)."""
    if group.ladders:
        ids = [case.id for case in ladder_cases()]
        test = "test_ladder"
    else:
        ids = (list(group.cases) if group.cases is not None else
               [case.id for case in recipe_cases() if case.own_recipe().slow == group.slow])
        test = "test_recipe"
    ids = [i for i in ids if i not in taken]
    taken.update(ids)
    return [f"{SUITE_FILE}::{test}[{case}]" for case in ids]


def night_node_ids(deselected: dict[str, str], measured_before: frozenset[str] = frozenset()) -> list[str]:
    """Every case of the night in its order (``CASE_GROUPS``), less the ``deselected`` ones; with
    ``measured_before`` (the case ids an earlier night of this device measured, ``--after``), the cases it did not
    measure first and those it did after them, each part in that order: a second window goes to what the first
    did not reach."""
    taken: set[str] = set(deselected)
    nodes = [node for group in CASE_GROUPS for node in suite_node_ids(group, taken)]
    again = [node for node in nodes if node[node.index("[") + 1:-1] in measured_before]
    return [node for node in nodes if node not in again] + again


def smoke_node_ids(root: Path, measured: list[str]) -> list[str]:
    """The smoke step's tests in their order: the self-checks of the method first (what only they tell), then each
    CUDA path that none of the night's ``measured`` node ids measures anyway."""
    tree = ast.parse((root / SMOKE_FILE).read_text(encoding="utf-8"))
    tests = [node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
    paths = {}
    for node in tree.body:  # CUDA_PATHS = [("resnet18", "baseline"), ...]: literal lists, read without importing
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id.endswith("_PATHS"):
            paths[node.targets[0].id] = ast.literal_eval(node.value)
    cases = {node[node.index("[") + 1:-1] for node in measured}
    checks = [f"{SMOKE_FILE}::{name}" for name in tests if name not in SMOKE_PATH_TESTS]
    path_ids = [f"{SMOKE_FILE}::{test}[{workload}-{recipe}]"
                for test, table in (("test_cuda_path", "CUDA_PATHS"), ("test_multi_gpu_path", "MULTI_GPU_PATHS"))
                for workload, recipe in paths.get(table, ()) if f"{workload}-{recipe}" not in cases]
    return checks + path_ids
