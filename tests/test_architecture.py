"""The library's shape: device specifics in one module, no import cycles, a plugin that stays glue, one reader of
run files, pytest-benchmark's privates in one adapter, one answer to whether a case can run here, short runner units."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "src" / "trainbench"
MODULES = {path.stem: path for path in PACKAGE.glob("*.py")}


def _trainbench_imports(path: Path) -> set[str]:
    """Modules of the package that ``path`` imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found.update(alias.name for alias in node.names if alias.name in MODULES)
            elif node.module and node.module.startswith("trainbench."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("trainbench."))
    return found & set(MODULES)


@pytest.mark.parametrize("name", sorted(set(MODULES) - {"device"}))
def test_only_the_device_module_knows_cuda(name):
    source = MODULES[name].read_text()
    assert "torch.cuda" not in source
    device_kind = r"""["'](?:cuda|cpu|mps|xpu)["']"""
    assert not re.search(rf"""(?:kind|type)["')\]]*\s*[!=]=\s*{device_kind}|{device_kind}\s*(?:==|!=)""", source)


def test_the_package_has_no_import_cycle():
    graph = {name: _trainbench_imports(path) - {name} for name, path in MODULES.items()}
    done, visiting = set(), []

    def visit(name):
        assert name not in visiting, "import cycle: " + " -> ".join(visiting[visiting.index(name):] + [name])
        if name in done:
            return
        visiting.append(name)
        for dependency in sorted(graph[name]):
            visit(dependency)
        visiting.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)


def test_the_core_does_not_import_pytest():
    # pytest-free: the runner, the measurement and everything under them serve asv too
    glue = {"plugin", "options", "session", "fixture", "summary", "benchmark_adapter", "project", "__main__"}
    for name, path in MODULES.items():
        if name not in glue:
            assert "pytest" not in _imported_names(path), f"{name}.py imports pytest"


def _imported_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


PLUGIN_MAX_LINES = 300


def test_the_plugin_module_stays_glue():
    lines = len(MODULES["plugin"].read_text().splitlines())
    assert lines <= PLUGIN_MAX_LINES, f"plugin.py has {lines} lines: move what is not glue into session/options/core"


# pytest-benchmark internals (names starting with an underscore, or options it owns, written to): each one
# used outside benchmark_adapter.py would break on a pytest-benchmark release without one place to fix.
PYTEST_BENCHMARK_PRIVATES = (r"_benchmarksession", r"\._mode\b", r"\._timer\b", r"compared_mapping",
                             r"option\.benchmark_compare\s*=", r"\._next_num\b", r"storage\.save\s*=")


@pytest.mark.parametrize("name", sorted(set(MODULES) - {"benchmark_adapter"}))
def test_pytest_benchmark_privates_only_in_the_adapter(name):
    source = MODULES[name].read_text()
    used = [p for p in PYTEST_BENCHMARK_PRIVATES if re.search(p, source)]
    assert not used, f"{name}.py uses pytest-benchmark internals {used}: go through benchmark_adapter.py"


@pytest.mark.parametrize("name", sorted(set(MODULES) - {"store"}))
def test_only_the_store_reads_saved_runs(name):
    # Saved runs are found and read by store.py alone: one matcher of run names, one check of a run's shape,
    # one choice of the baseline.
    source = MODULES[name].read_text()
    for marker in ("pytest_benchmark.storage", "get_machine_id", "trainbench_incomplete", "[0-9][0-9][0-9][0-9]_",
                   "def load_run", "def latest_run", '.get("benchmarks")'):
        assert marker not in source, f"{name}.py has {marker!r}: saved runs are read through store.py"


def _metric_name_collections(source: str) -> list[tuple[int, list[str]]]:
    """Literal tuples, lists and sets of two or more metric names and nothing else, and constant dicts whose keys
    or values are all metric names: metrics picked by hand, i.e. a definition of a kind of metric."""
    from trainbench.metrics import METRICS

    def metric_names(nodes) -> list[str]:
        names = [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)
                 and n.value in METRICS]
        return names if len(names) >= 2 and len(names) == len(nodes) else []

    def constant(node) -> bool:
        return isinstance(node, ast.Constant) or isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant)

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            listed = metric_names(node.elts)
        elif isinstance(node, ast.Dict) and all(constant(v) for v in node.values):
            listed = metric_names(node.keys) or metric_names(node.values)
        else:
            continue
        if listed:
            found.append((node.lineno, listed))
    return found


def test_only_the_metrics_module_lists_metrics_by_kind():
    for name, path in MODULES.items():
        if name != "metrics":
            assert not _metric_name_collections(path.read_text()), f"{name}.py lists metrics: ask trainbench.metrics"


def test_the_metric_list_check_sees_the_lists_it_forbids():
    assert _metric_name_collections('TIMED = ("samples_per_s", "step_time_ms")\nif m in {"mfu", "warmup_s"}: pass')
    assert _metric_name_collections('PER_ROUND = {"samples_per_s": -1, "step_time_ms": 1}')
    assert _metric_name_collections('ALIASES = {"peak_memory": "peak_memory_mib", "memory": "tracked_peak_mib"}')
    # a record built from the metrics' values, or result fields that share some metrics' names, are not lists of them
    assert not _metric_name_collections('row = {"samples_per_s": rate, "step_time_ms": step * 1e3}')
    assert not _metric_name_collections('FIELDS = ("ops_per_step", "syncs_per_step", "flops_per_step")')


# What a device offers and what a recipe requires of it: comparing the two decides whether a case can run.
DEVICE_FACTS = {"cuda", "capability", "gpu_count", "bf16", "min_capability", "gpu_capability", "min_gpus"}
# Texts of the reasons a case cannot run here; a second module writing one is a second answer.
SKIP_REASONS = ("slow case:", "needs a CUDA device; this run uses", "needs compute capability >=", "not in an A/B run",
                "a ladder rung is compared through", "a profiler of its own", "for the allocator and workspaces")


@pytest.mark.parametrize("name", sorted(set(MODULES) - {"eligibility", "device"}))
def test_only_eligibility_says_whether_a_case_can_run_here(name):
    # device.py measures the facts; eligibility.why_not is the one place that compares them and says why not
    source = MODULES[name].read_text()
    compared = [f"line {node.lineno}: .{operand.attr}" for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.Compare)
                for operand in (node.left, *node.comparators)
                if isinstance(operand, ast.Attribute) and operand.attr in DEVICE_FACTS]
    assert not compared, f"{name}.py compares device capabilities (ask eligibility.why_not): {compared}"
    written = [text for text in SKIP_REASONS if text in source]
    assert not written, f"{name}.py writes skip reasons of its own (ask eligibility.why_not): {written}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_is_read_in_units_of_at_most_60_lines(name):
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(MODULES[name].read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60]
    assert not long, f"{name}.py: split {long}"


def test_trainbench_switches_are_read_only_through_the_switch_table():
    # "0" means off and "maybe" is refused only where every reader asks host.env_switch
    from trainbench.host import SWITCHES

    for name, path in MODULES.items():
        source = path.read_text()
        for switch in SWITCHES:
            assert not re.search(rf"""(?:environ|getenv)\s*(?:\.get\(|\[|\()\s*["']{switch}["']""", source), \
                f"{name}.py reads {switch} itself: ask host.env_switch"


# Modules whose dataclasses are values a case hands on (its outcome, verdicts, results, plan, the session's record of
# it): each step returns a new one (dataclasses.replace), so none changes what another step or the session holds.
VALUE_MODULES = ("outcome", "result", "guards", "budgets", "plan", "execute", "judge")
_MUTATORS = {"append", "extend", "insert", "update", "pop", "clear", "remove", "setdefault"}


def _changed_in_place(source: str, values: tuple[str, ...] = ("outcome",)) -> list[str]:
    """Dataclasses not declared frozen, and changes to a variable named like a value (``outcome.failures +=``,
    ``outcome.result = ``, ``outcome.failures.append(...)``, ``setattr(outcome, ...)``)."""
    def of_value(node) -> bool:
        while isinstance(node, ast.Attribute):
            node = node.value
        return isinstance(node, ast.Name) and node.id in values

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            for d in node.decorator_list:
                call = d if isinstance(d, ast.Call) else None
                name = getattr(call.func if call else d, "id", getattr(call.func if call else d, "attr", None))
                frozen = call is not None and any(k.arg == "frozen" and getattr(k.value, "value", False)
                                                  for k in call.keywords)
                if name == "dataclass" and not frozen:
                    found.append(f"line {node.lineno}: dataclass {node.name} is not frozen")
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        found += [f"line {node.lineno}: assigns to {ast.unparse(t)}" for t in targets
                  if isinstance(t, ast.Attribute) and of_value(t)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in _MUTATORS and isinstance(node.func.value, ast.Attribute) and of_value(node.func.value):
                found.append(f"line {node.lineno}: {ast.unparse(node.func)}")
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and node.args \
                and of_value(node.args[0]):
            found.append(f"line {node.lineno}: setattr({ast.unparse(node.args[0])}, ...)")
    return found


@pytest.mark.parametrize("name", sorted(MODULES))
def test_outcomes_are_values_no_step_changes_in_place(name):
    source = MODULES[name].read_text()
    if name in VALUE_MODULES:
        assert not _changed_in_place(source), f"{name}.py: {_changed_in_place(source)}"
    changed = [line for line in _changed_in_place(source) if "not frozen" not in line]
    assert not changed, f"{name}.py changes an outcome in place (return dataclasses.replace(outcome, ...)): {changed}"


def test_the_value_check_sees_the_changes_it_forbids():
    assert _changed_in_place("@dataclass\nclass CaseOutcome:\n    failures: list")
    assert _changed_in_place("@dataclasses.dataclass(eq=False)\nclass Verdict:\n    ok: bool")
    assert _changed_in_place("outcome.failures += lines")
    assert _changed_in_place("outcome.result = outcome.result.replace(notes=[])")
    assert _changed_in_place("outcome.failures.append(error)")
    assert _changed_in_place("setattr(outcome, side, new)")
    # a frozen dataclass, a new outcome, another object's attributes and a local list are not changes of an outcome
    assert not _changed_in_place("@dataclass(frozen=True)\nclass CaseOutcome:\n    failures: tuple = ()")
    assert not _changed_in_place("outcome = dataclasses.replace(outcome, failures=(*outcome.failures, error))")
    assert not _changed_in_place("self.results[key] = outcome.result\nfailures.append(outcome.error)")


def test_a_case_outcome_cannot_be_changed():
    import dataclasses

    from trainbench.outcome import CaseOutcome
    from trainbench.recipes import get_recipe
    from trainbench.session import RecordedCase

    outcome = CaseOutcome("mlp-baseline", get_recipe("baseline"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        outcome.failures = ("changed",)
    assert isinstance(outcome.failures, tuple) and isinstance(outcome.budget_verdicts, tuple)
    assert dataclasses.fields(RecordedCase) and RecordedCase.__dataclass_params__.frozen
