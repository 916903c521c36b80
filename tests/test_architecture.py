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


# Reading rounds statistically (an interval, a median change, a test, resampling) is trainbench.stats's: a second
# implementation is a second rule for whether timing can be judged.
STATISTICS_NAMES = re.compile(r"median|interval|bootstrap|resampl", re.IGNORECASE)
STATISTICS_CALLS = {"bootstrap", "permutation_test", "mannwhitneyu", "binomtest", "wilcoxon", "ttest_ind", "ttest_rel"}
FORMATTERS = {"interval"}  # render.interval writes an interval it is given; it computes none


def _statistics_of_its_own(source: str) -> list[str]:
    """Where ``source`` computes statistics of its own: scipy imported, a resampling or test called, numpy's median
    taken, or a function defined whose name says it computes a median or an interval. ``statistics.median`` is
    Python's own and fine anywhere."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(name.split(".")[0] == "scipy" for name in names) and getattr(node, "level", 0) == 0:
                found.append(f"line {node.lineno}: imports scipy")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if STATISTICS_NAMES.search(node.name) and node.name not in FORMATTERS:
                found.append(f"line {node.lineno}: def {node.name}")
        elif isinstance(node, ast.Attribute):
            numpy_median = (node.attr in {"median", "percentile", "quantile"} and isinstance(node.value, ast.Name)
                            and node.value.id in {"np", "numpy"})
            if node.attr in STATISTICS_CALLS or numpy_median:
                found.append(f"line {node.lineno}: .{node.attr}")
    return found


@pytest.mark.parametrize("name", sorted(set(MODULES) - {"stats"}))
def test_only_the_stats_module_computes_intervals_medians_and_tests(name):
    found = _statistics_of_its_own(MODULES[name].read_text())
    assert not found, f"{name}.py computes statistics of its own (ask trainbench.stats): {found}"


def test_the_statistics_check_sees_what_it_forbids():
    assert _statistics_of_its_own("from scipy import stats")
    assert _statistics_of_its_own("import scipy.stats")
    assert _statistics_of_its_own("def _median(values):\n    ordered = sorted(values)\n    return ordered[len(values) // 2]")
    assert _statistics_of_its_own("def change_interval(base, cur, paired):\n    pass")
    assert _statistics_of_its_own("boot = stats.bootstrap((x,), np.mean)")
    assert _statistics_of_its_own("m = np.median(x, axis=-1)")
    # Python's median, the stats module's own functions, and a formatter of an interval given to it are not
    assert not _statistics_of_its_own("import statistics\nm = statistics.median(xs)")
    assert not _statistics_of_its_own("from .stats import median_interval\nci = median_interval(a, b, True)")
    assert not _statistics_of_its_own("def interval(ratios):\n    return f'{ratios[0]}..{ratios[1]}'")
