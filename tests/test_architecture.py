"""The library's shape: device specifics in one module, no import cycles, a plugin that stays glue, one reader of
run files, pytest-benchmark's privates in one adapter, one answer to whether a case can run here, short runner units."""

import ast
import functools
import re
from pathlib import Path

import pytest

# Every rule reads every module's syntax tree: each source parsed once (the trees are only read).
_parse = functools.lru_cache(maxsize=None)(ast.parse)
PACKAGE = Path(__file__).parents[1] / "src" / "trainbench"
# Every module by its dotted name under the package ("store", "cli.report"; a subpackage by its own name, "cli").
MODULES = {".".join(path.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__"): path
           for path in PACKAGE.rglob("*.py")}


def for_each_module(names):
    """A rule on every module ``names`` lists, as one test: it checks each of them and fails naming every module that
    breaks the rule, with that module's own message (one test, not one per module: ~120 modules times 16 rules)."""
    names = list(names)

    def rule(check):
        def test():
            broken = []
            for name in names:
                try:
                    check(name)
                except AssertionError as e:
                    broken.append(f"{name}: {e}")
            assert not broken, f"{len(broken)} module(s) break the rule:\n" + "\n".join(broken)

        test.__name__, test.__qualname__, test.__doc__ = check.__name__, check.__qualname__, check.__doc__
        return test

    return rule


# The layers, lowest first: a module imports its own layer and those below it, never one above. The device backends
# know no training; the core measures without pytest; verdicts read what was measured; jobs run several runs,
# processes or sessions (A/B, bisect, the night, the doctor); the pytest glue and the command line are the two
# front ends (the command line may read a user's project as its pytest does).
LAYERS = ("devices", "core", "verdicts", "jobs", "plugin", "cli")
# The core's wings, lowest first, by the same rule: a wing imports its own and those before it. The harness and the
# records are torch-free; setups build what is trained; analyses read a setup without timing it; the method times
# it; processes are the entry points of the processes the method starts.
WINGS = ("harness", "records", "setups", "analyses", "method", "processes")


def layer_of(name: str) -> str:
    """``core.method.measure`` -> ``core``; the package's own ``__init__`` and ``__main__`` are their own layer."""
    return name.split(".")[0] if name.split(".")[0] in LAYERS else name or "__init__"


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``: imports for annotations only, which run never."""
    return {id(sub) for node in ast.walk(tree) if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
            for stmt in node.body for sub in ast.walk(stmt)}


def _trainbench_imports(path: Path, at_run_time: bool = False) -> set[str]:
    """Modules of the package that ``path`` imports, at module level or inside functions (``at_run_time``: without
    those imported for annotations only, under ``if TYPE_CHECKING:``)."""
    package = list(path.relative_to(PACKAGE).parts[:-1])  # where ``from .`` starts: "cli" in cli/report.py
    found = set()
    tree = _parse(path.read_text())
    annotations_only = _type_checking_only(tree) if at_run_time else set()
    for node in ast.walk(tree):
        if id(node) in annotations_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
            elif node.module and node.module.startswith("trainbench."):
                base = node.module.split(".")[1:]
            else:
                continue
            found.update(_module_named(base + [alias.name]) for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(_module_named(a.name.split(".")[1:]) for a in node.names if a.name.startswith("trainbench."))
    return found & set(MODULES)


def _module_named(parts: list[str]) -> str:
    """The package's module that ``parts`` (a dotted path, perhaps ending in a name the module defines) is in."""
    while parts and ".".join(parts) not in MODULES:
        parts = parts[:-1]
    return ".".join(parts)


# devices.caps is the device module's torch-free half (what a device offers, rebuilt from a recorded identity)
@for_each_module(sorted(set(MODULES) - {"devices.device", "devices.caps"}))
def test_only_the_device_module_knows_cuda(name):
    source = MODULES[name].read_text()
    assert "torch.cuda" not in source
    device_kind = r"""["'](?:cuda|cpu|mps|xpu)["']"""
    assert not re.search(rf"""(?:kind|type)["')\]]*\s*[!=]=\s*{device_kind}|{device_kind}\s*(?:==|!=)""", source)


def test_the_package_has_no_import_cycle():
    # a module names another's type for its annotations (the setup its hooks are given) without a cycle at run time;
    # the layer and wing rules count those imports too
    graph = {name: _trainbench_imports(path, at_run_time=True) - {name} for name, path in MODULES.items()}
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


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    order = {layer: i for i, layer in enumerate(LAYERS)}
    return [f"{name} ({layer_of(name)}) imports {dep} ({layer_of(dep)})" for name, deps in sorted(graph.items())
            for dep in sorted(deps) if layer_of(name) in order and layer_of(dep) in order
            and order[layer_of(dep)] > order[layer_of(name)]]


def test_every_module_belongs_to_a_layer_and_imports_none_above_it():
    unplaced = [name for name in MODULES if layer_of(name) not in (*LAYERS, "__init__", "__main__")]
    assert not unplaced, f"modules outside the layers {LAYERS}: {unplaced}"
    graph = {name: _trainbench_imports(path) - {name} for name, path in MODULES.items()}
    assert not _layer_violations(graph)


def wing_of(name: str) -> str | None:
    """``core.method.measure`` -> ``method``; None outside the core's wings."""
    parts = name.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "core" else None


def _wing_violations(graph: dict[str, set[str]]) -> list[str]:
    order = {wing: i for i, wing in enumerate(WINGS)}
    return [f"{name} ({wing_of(name)}) imports {dep} ({wing_of(dep)})" for name, deps in sorted(graph.items())
            for dep in sorted(deps) if wing_of(name) and wing_of(dep)
            and order[wing_of(dep)] > order[wing_of(name)]]


def test_every_core_module_is_in_a_wing_and_imports_none_after_it():
    core = [name for name in MODULES if name.startswith("core.")]
    assert not [name for name in core if wing_of(name) not in WINGS and name.count(".") != 1], core
    assert {name.split(".")[1] for name in core} == set(WINGS), "a wing without a module, or a module beside them"
    graph = {name: _trainbench_imports(path) - {name} for name, path in MODULES.items()}
    assert not _wing_violations(graph)


def test_the_wing_check_sees_an_import_from_a_later_wing():
    assert _wing_violations({"core.records.result": {"core.analyses.attribution"}}) == \
        ["core.records.result (records) imports core.analyses.attribution (analyses)"]
    assert not _wing_violations({"core.method.measure": {"core.setups.training", "core.harness.costs"}})


def test_the_layer_check_sees_an_import_from_above():
    assert _layer_violations({"core.records.budgets": {"verdicts.compare"}}) == \
        ["core.records.budgets (core) imports verdicts.compare (verdicts)"]
    assert _layer_violations({"devices.host": {"plugin.session"}})
    assert not _layer_violations({"plugin.session": {"verdicts.store", "core.method.runner", "devices.device"},
                                  "cli.calibrate": {"plugin.project"}})


def test_the_core_does_not_import_pytest():
    # pytest-free: the runner, the measurement and everything under them serve asv too
    for name, path in MODULES.items():
        if layer_of(name) not in ("plugin", "__main__"):
            assert "pytest" not in _imported_names(path), f"{name}.py imports pytest"


def _imported_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(_parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


PLUGIN_MAX_LINES = 300


def test_the_plugin_module_stays_glue():
    lines = len(MODULES["plugin"].read_text().splitlines())
    assert lines <= PLUGIN_MAX_LINES, f"plugin.py has {lines} lines: move what is not glue into session/options/core"


MAIN_MAX_LINES = 40
CLI_HELPERS = {"cli", "cli.shared"}  # the table of subcommands, and what more than one of them reads


def test_main_is_a_thin_entry_point_and_each_cli_module_is_one_subcommand():
    # __main__.py only calls trainbench.cli; a subcommand is a module of its own, listed in the table
    main = MODULES["__main__"].read_text()
    assert len(main.splitlines()) <= MAIN_MAX_LINES and "add_argument" not in main and "def " not in main
    from trainbench import cli

    commands = {name: path for name, path in MODULES.items() if name.startswith("cli.") and name not in CLI_HELPERS}
    assert sorted(command.__name__.removeprefix("trainbench.") for command in cli.COMMANDS) == sorted(commands)
    for name, path in commands.items():
        assert _subcommand_shape(path.read_text()) == [], f"{name}.py: one subcommand, NAME/HELP/DESCRIPTION, " \
                                                           "add_arguments and run"
    assert len({command.NAME for command in cli.COMMANDS}) == len(cli.COMMANDS)


def _subcommand_shape(source: str) -> list[str]:
    """What a subcommand module lacks or has too many of: its names, add_arguments, run, one add_parser (the table's)."""
    tree = _parse(source)
    assigned = {target.id for node in tree.body if isinstance(node, ast.Assign) for target in node.targets
                if isinstance(target, ast.Name)}
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    problems = [f"no {name}" for name in ("NAME", "HELP", "DESCRIPTION") if name not in assigned]
    problems += [f"no {name}()" for name in ("add_arguments", "run") if name not in defined]
    if "add_parser" in source or "add_subparsers" in source:
        problems.append("registers subcommands itself (the table in cli/__init__.py does)")
    return problems


def test_the_command_line_loads_neither_torch_nor_pytest_until_a_subcommand_needs_them():
    # --help, verdict and explain stay quick: a subcommand module imports what loads torch (or pytest) in run()
    import os
    import subprocess
    import sys

    probe = ("import sys; from trainbench.cli import build_parser; build_parser(); "
             "print(sorted({'torch', 'pytest'} & set(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)}).stdout
    assert loaded.strip() == "[]"


def test_the_subcommand_check_sees_a_module_that_is_not_one():
    one = 'NAME = "x"\nHELP = DESCRIPTION = ""\ndef add_arguments(parser): pass\ndef run(args): return 0\n'
    assert _subcommand_shape(one) == []
    assert _subcommand_shape(one.replace("def run", "def handle")) == ["no run()"]
    assert _subcommand_shape(one + "def more(subparsers):\n    subparsers.add_parser('y')\n")


# pytest-benchmark internals (names starting with an underscore, or options it owns, written to): each one
# used outside benchmark_adapter.py would break on a pytest-benchmark release without one place to fix.
PYTEST_BENCHMARK_PRIVATES = (r"_benchmarksession", r"\._mode\b", r"\._timer\b", r"compared_mapping",
                             r"option\.benchmark_compare\s*=", r"\._next_num\b", r"storage\.save\s*=",
                             r"\.location\b", r"\.get_machine_info\(", r"\.save_data\b")


@for_each_module(sorted(set(MODULES) - {"plugin.benchmark_adapter"}))
def test_pytest_benchmark_privates_only_in_the_adapter(name):
    source = MODULES[name].read_text()
    used = [p for p in PYTEST_BENCHMARK_PRIVATES if re.search(p, source)]
    assert not used, f"{name}.py uses pytest-benchmark internals {used}: go through benchmark_adapter.py"


@for_each_module(sorted(set(MODULES) - {"verdicts.store"}))
def test_only_the_store_reads_saved_runs(name):
    # Saved runs are found and read by store.py alone: one matcher of run names, one check of a run's shape,
    # one choice of the baseline.
    source = MODULES[name].read_text()
    for marker in ("pytest_benchmark.storage", "get_machine_id", "trainbench_incomplete", "[0-9][0-9][0-9][0-9]_",
                   "def load_run", "def latest_run", '.get("benchmarks")'):
        assert marker not in source, f"{name}.py has {marker!r}: saved runs are read through store.py"


# What a saved run holds (pytest-benchmark's benchmarks list, each case's record in its extra_info): read by
# store.SavedRun alone, so a reader elsewhere cannot grow guards, or an answer to "which device made it", of its own.
SAVED_RUN_CONTENTS = (r"""\[\s*["']benchmarks["']\s*\]""", r"""\.get\(\s*["']benchmarks["']""", r"\bextra_info\b")


def _saved_run_reads(source: str) -> list[str]:
    return [pattern for pattern in SAVED_RUN_CONTENTS if re.search(pattern, source)]


@for_each_module(sorted(set(MODULES) - {"verdicts.store"}))
def test_only_the_store_reads_what_a_saved_run_holds(name):
    found = _saved_run_reads(MODULES[name].read_text())
    assert not found, f"{name}.py reads a saved run's contents ({found}): ask store.SavedRun"


def test_the_saved_run_check_sees_the_reads_it_forbids():
    assert _saved_run_reads('for bench in run.get("benchmarks", []):')
    assert _saved_run_reads("merged['benchmarks'] += run[ 'benchmarks' ]")
    assert _saved_run_reads('info = bench.get("extra_info") or {}')
    assert _saved_run_reads("self.benchmark.extra_info.update(record)")
    assert not _saved_run_reads('for record in SavedRun.load(path).cases():\n    device = run.device')


def test_reading_a_saved_run_does_not_import_torch():
    # comparing, explaining and calibrating saved runs need no torch: the record layer must not pull it in, nor the
    # budgets, the fleet or what a device offers (devices.caps; devices.device's live backends import torch)
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from trainbench.verdicts.store import SavedRun\n"
        "import trainbench.verdicts.compare, trainbench.core.records.result, trainbench.verdicts.calibrate\n"
        "import trainbench.core.records.budgets, trainbench.devices.fleet, trainbench.devices.caps\n"
        "run = SavedRun('run.json', {'machine_info': {'trainbench': {'kind': 'cpu', 'name': 'x'}}, 'benchmarks': ["
        "{'fullname': 't[c]', 'extra_info': {'case': 'c', 'samples_per_step': 1, 'profile': 'cpu'}}]})\n"
        "assert [r.case for r in run.cases()] == ['c'] and run.device['name'] == 'x' and run.profile == 'cpu'\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(PACKAGE.parent), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 0, done.stderr


def _metric_name_collections(source: str) -> list[tuple[int, list[str]]]:
    """Literal tuples, lists and sets of two or more metric names and nothing else, and constant dicts whose keys
    or values are all metric names: metrics picked by hand, i.e. a definition of a kind of metric."""
    from trainbench.core.records.metrics import METRICS

    def metric_names(nodes) -> list[str]:
        names = [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)
                 and n.value in METRICS]
        return names if len(names) >= 2 and len(names) == len(nodes) else []

    def constant(node) -> bool:
        return isinstance(node, ast.Constant) or isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant)

    found = []
    for node in ast.walk(_parse(source)):
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
        if name != "core.records.metrics":
            assert not _metric_name_collections(path.read_text()), f"{name}.py lists metrics: ask trainbench.core.records.metrics"


def test_the_metric_list_check_sees_the_lists_it_forbids():
    assert _metric_name_collections('TIMED = ("samples_per_s", "step_time_ms")\nif m in {"mfu", "warmup_s"}: pass')
    assert _metric_name_collections('PER_ROUND = {"samples_per_s": -1, "step_time_ms": 1}')
    assert _metric_name_collections('ALIASES = {"peak_memory": "peak_memory_mib", "memory": "tracked_peak_mib"}')
    # a record built from the metrics' values, or result fields that share some metrics' names, are not lists of them
    assert not _metric_name_collections('row = {"samples_per_s": rate, "step_time_ms": step * 1e3}')
    assert not _metric_name_collections('FIELDS = ("ops_per_step", "syncs_per_step", "flops_per_step")')


def _knob_name_collections(source: str) -> list[tuple[int, list[str]]]:
    """Knobs picked by hand, i.e. a knob rule outside the knob table: literal tuples, lists and sets of two or more
    knob names and nothing else; dicts of two or more knobs to constants (``{"num_workers": 0, ...}``), where a
    recipe's changes hold values made per profile; ``replace(config, a=..., b=...)`` setting two or more knobs to
    constants; and ``config.a or config.b`` over two or more knobs."""
    import dataclasses

    from trainbench.core.setups.recipes import TrainConfig

    knobs = {f.name for f in dataclasses.fields(TrainConfig)}

    def knob_names(names: list) -> list[str]:
        return names if len(names) >= 2 and all(isinstance(n, str) and n in knobs for n in names) else []

    def constant(node) -> bool:
        return isinstance(node, (ast.Constant, ast.Attribute)) or isinstance(node, ast.UnaryOp) and constant(node.operand)

    found = []
    for node in ast.walk(_parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            listed = knob_names([getattr(e, "value", None) for e in node.elts])
        elif isinstance(node, ast.Dict) and all(constant(v) for v in node.values):
            listed = knob_names([getattr(k, "value", None) for k in node.keys])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "replace":
            listed = knob_names([k.arg for k in node.keywords if k.arg in knobs and constant(k.value)])
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            listed = knob_names([v.attr for v in node.values if isinstance(v, ast.Attribute) and v.attr in knobs])
        else:
            continue
        if listed:
            found.append((node.lineno, listed))
    return found


def test_only_the_knob_table_lists_knobs():
    # A knob's rules (data path, process-wide state, fake tensors, what the spec must give...) are its entries in
    # TrainConfig's knob table (recipes.Knob); each module asks TrainConfig.turned. recipes.py holds the table and the
    # recipes' changes.
    for name, path in MODULES.items():
        if name != "core.setups.recipes":
            assert not _knob_name_collections(path.read_text()), f"{name}.py lists knobs: ask the knob table (recipes.Knob)"


def test_the_knob_list_check_sees_the_lists_it_forbids():
    assert _knob_name_collections('for knob in ("cudnn_benchmark", "deterministic", "debug"): pass')
    assert _knob_name_collections('SAME = {"num_workers": 0, "loader_timeout_s": TrainConfig.loader_timeout_s}')
    assert _knob_name_collections("replace(config, compile=False, parallel=None, world_size=n)")
    assert _knob_name_collections("if config.compile or config.fuse_pointwise: pass")
    # a recipe's changes made per profile, one knob set, or two knobs that go together, are not lists of knobs
    assert not _knob_name_collections('AMP = {"amp": ByProfile(cpu="bf16", gpu="fp16"), "grad_scaler": False}')
    assert not _knob_name_collections("replace(config, world_size=nodes * ranks, seed=0)")
    assert not _knob_name_collections('if config.amp and config.grad_scaler: pass\nMODES = ("deterministic", "item")')


def _knob_branches(source: str) -> list[tuple[int, str]]:
    """(line, knob) for each branch on a built-in knob's value: a knob of a config named in the test of an ``if``, a
    conditional expression, a ``while`` or a comprehension's condition (``if config.amp:``, ``x if cfg.compile``)."""
    import dataclasses

    from trainbench.core.setups.recipes import TrainConfig

    knobs = {f.name for f in dataclasses.fields(TrainConfig)} - {"seed", "batch_size", "user_knobs"}
    found = []
    for node in ast.walk(_parse(source)):
        tests = [node.test] if isinstance(node, (ast.If, ast.IfExp, ast.While)) else \
            node.ifs if isinstance(node, ast.comprehension) else []
        for test in tests:
            for sub in ast.walk(test):
                if isinstance(sub, ast.Attribute) and sub.attr in knobs and "config" in ast.unparse(sub.value):
                    found.append((sub.lineno, sub.attr))
    return found


# What a knob does is its entry: its table fields (recipes.py) and its effect (effects.py). Elsewhere a knob's value
# is passed on or asked through the table (TrainConfig's properties, turned, effects), never branched on.
KNOB_ENTRIES = {"core.setups.recipes", "core.setups.effects"}


@for_each_module(sorted(set(MODULES) - KNOB_ENTRIES))
def test_no_module_branches_on_a_knob_outside_its_entry(name):
    assert not _knob_branches(MODULES[name].read_text()), \
        f"{name}.py branches on a knob: give the knob's entry an effect (effects.py) or ask TrainConfig"


def test_the_knob_branch_check_sees_what_it_forbids():
    assert _knob_branches("if config.amp:\n    pass") == [(1, "amp")]
    assert _knob_branches("x = 1 if self.training.config.parallel == 'dp' else 2") == [(1, "parallel")]
    assert _knob_branches("[p for p in ps if cfg.config.compile]") == [(1, "compile")]
    assert not _knob_branches("if config.trains:\n    pass\nbatch = config.loader_batch_size(spec)")
    assert not _knob_branches("DataLoader(num_workers=config.num_workers)")  # passed on, not branched on


# Words pytest, the doctor and the night print too: not a verdict's own, so not looked for.
SHARED_WORDS = {"FAIL", "FAILED", "passed", "ERROR"}


def _verdict_words(source: str) -> list[tuple[int, str]]:
    """String literals (docstrings aside) that hold the words ``trainbench.verdicts.present`` gives a verdict's outcomes: a
    second place that says an outcome, which would soon say it differently."""
    from trainbench.verdicts.present import FINDING, STATUS

    words = {*STATUS.values(), *(word for pair in FINDING.values() for word in pair)} - SHARED_WORDS
    tree = _parse(source)
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
                  and isinstance(node.value, ast.Constant)}
    return [(node.lineno, word) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            for word in words if re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", node.value)]


@for_each_module(sorted(set(MODULES) - {"verdicts.present"}))
def test_only_the_presenter_says_a_verdicts_outcomes(name):
    said = _verdict_words(MODULES[name].read_text())
    assert not said, f"{name}.py says verdict outcomes itself (ask trainbench.verdicts.present): {said}"


def test_the_outcome_check_sees_the_words_it_forbids():
    assert _verdict_words('line = "REGRESSION " + c.describe()')
    assert _verdict_words('write(f"{case}: COULD NOT JUDGE after {n} rounds")')
    assert _verdict_words('WORDS = {"improved": "IMPROVED", "inconclusive": "INCONCLUSIVE"}')
    assert _verdict_words('title = "trainbench compare vs x: regressed (not gated): y"')
    # the outcomes' values themselves, docstrings, and words pytest and the doctor print too are not its words
    assert not _verdict_words('if c.verdict == "regressed" or status == "FAIL": pass')
    assert not _verdict_words('def f():\n    """Prints REGRESSION under a gate."""\n    return EXIT_COULD_NOT_JUDGE')


# What a device offers and what a recipe requires of it: comparing the two decides whether a case can run.
DEVICE_FACTS = {"cuda", "capability", "gpu_count", "bf16", "min_capability", "gpu_capability", "min_gpus"}
# Texts of the reasons a case cannot run here; a second module writing one is a second answer.
SKIP_REASONS = ("slow case:", "needs a CUDA device; this run uses", "needs compute capability >=", "not in an A/B run",
                "a ladder rung is compared through", "a profiler of its own", "for the allocator and workspaces")


@for_each_module(sorted(set(MODULES) - {"core.setups.eligibility", "devices.device"}))
def test_only_eligibility_says_whether_a_case_can_run_here(name):
    # device.py measures the facts; eligibility.why_not is the one place that compares them and says why not
    source = MODULES[name].read_text()
    compared = [f"line {node.lineno}: .{operand.attr}" for node in ast.walk(_parse(source))
                if isinstance(node, ast.Compare)
                for operand in (node.left, *node.comparators)
                if isinstance(operand, ast.Attribute) and operand.attr in DEVICE_FACTS]
    assert not compared, f"{name}.py compares device capabilities (ask eligibility.why_not): {compared}"
    written = [text for text in SKIP_REASONS if text in source]
    assert not written, f"{name}.py writes skip reasons of its own (ask eligibility.why_not): {written}"


@for_each_module(sorted(MODULES))
def test_every_module_is_read_in_units_of_at_most_60_lines(name):
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(_parse(MODULES[name].read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60]
    assert not long, f"{name}.py: split {long}"


def _environment_reads(tree: ast.AST) -> list[str]:
    """The TRAINBENCH_* variables a module reads from the environment itself: ``os.environ.get(X)``,
    ``os.environ[X]``, ``os.getenv(X)`` (or an ``environ`` mapping's), X a string or a name the module binds to one."""
    constants = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                constants[getattr(target, "id", None) or getattr(target, "attr", None)] = node.value.value

    def environ(node) -> bool:
        return getattr(node, "attr", None) == "environ" or getattr(node, "id", None) == "environ"

    read = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args and (
                node.func.attr == "getenv" or node.func.attr in ("get", "pop", "setdefault") and environ(node.func.value)):
            key = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and environ(node.value):
            key = node.slice
        value = key.value if isinstance(key, ast.Constant) else constants.get(getattr(key, "id", None)
                                                                               or getattr(key, "attr", None))
        if isinstance(value, str) and value.startswith("TRAINBENCH_"):
            read.append(value)
    return read


def test_trainbench_variables_are_read_only_through_the_environment_table():
    # "0" means off, and a value a variable cannot take is refused in one line, only where every reader asks
    # host.env_value (host.env_switch): its table lists each variable with its kind and default
    from trainbench.devices.host import ENVIRONMENT

    for name, path in MODULES.items():
        source = path.read_text()
        if name != "devices.host":
            assert not _environment_reads(_parse(source)), f"{name}.py reads a TRAINBENCH_ variable itself: ask host.env_value"
        unlisted = set(re.findall(r"""["'](TRAINBENCH_[A-Z0-9_]+)["']""", source)) - set(ENVIRONMENT)
        assert not unlisted, f"{name}.py names {sorted(unlisted)}: list each in host.ENVIRONMENT"
    # the rule sees each way of reading one
    for read in ('os.environ.get("TRAINBENCH_X")', 'os.environ["TRAINBENCH_X"]', 'os.getenv("TRAINBENCH_X", "1")',
                 'ENV = "TRAINBENCH_X"\nos.environ.get(ENV)', 'class A:\n    ENV = "TRAINBENCH_X"\nos.environ.get(A.ENV)'):
        assert _environment_reads(_parse(read)) == ["TRAINBENCH_X"], read
    assert not _environment_reads(_parse('env = {**os.environ, "TRAINBENCH_X": "1"}\nos.environ.get("HOME")'))


# Reading rounds statistically (an interval, a median change, a test, resampling) is trainbench.core.records.stats's: a second
# implementation is a second rule for whether timing can be judged.
STATISTICS_NAMES = re.compile(r"median|interval|bootstrap|resampl", re.IGNORECASE)
STATISTICS_CALLS = {"bootstrap", "permutation_test", "mannwhitneyu", "binomtest", "wilcoxon", "ttest_ind", "ttest_rel"}
FORMATTERS = {"interval"}  # render.interval writes an interval it is given; it computes none


def _statistics_of_its_own(source: str) -> list[str]:
    """Where ``source`` computes statistics of its own: scipy imported, a resampling or test called, numpy's median
    taken, or a function defined whose name says it computes a median or an interval. ``statistics.median`` is
    Python's own and fine anywhere."""
    found = []
    for node in ast.walk(_parse(source)):
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


@for_each_module(sorted(set(MODULES) - {"core.records.stats"}))
def test_only_the_stats_module_computes_intervals_medians_and_tests(name):
    found = _statistics_of_its_own(MODULES[name].read_text())
    assert not found, f"{name}.py computes statistics of its own (ask trainbench.core.records.stats): {found}"


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


# Modules whose dataclasses are values a case hands on (its outcome, verdicts, results, plan, the session's record of
# it): each step returns a new one (dataclasses.replace), so none changes what another step or the session holds.
VALUE_MODULES = tuple(f"core.{name}" for name in ("outcome", "result", "guards", "budgets", "plan", "execute", "judge"))
_MUTATORS = {"append", "extend", "insert", "update", "pop", "clear", "remove", "setdefault"}


def _changed_in_place(source: str, values: tuple[str, ...] = ("outcome",)) -> list[str]:
    """Dataclasses not declared frozen, and changes to a variable named like a value (``outcome.failures +=``,
    ``outcome.result = ``, ``outcome.failures.append(...)``, ``setattr(outcome, ...)``)."""
    def of_value(node) -> bool:
        while isinstance(node, ast.Attribute):
            node = node.value
        return isinstance(node, ast.Name) and node.id in values

    found = []
    for node in ast.walk(_parse(source)):
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


@for_each_module(sorted(MODULES))
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

    from trainbench.core.records.outcome import CaseOutcome
    from trainbench.core.setups.recipes import get_recipe
    from trainbench.plugin.recorded import RecordedCase

    outcome = CaseOutcome("mlp-baseline", get_recipe("baseline"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        outcome.failures = ("changed",)
    assert isinstance(outcome.failures, tuple) and isinstance(outcome.bound_checks, tuple)
    assert dataclasses.fields(RecordedCase) and RecordedCase.__dataclass_params__.frozen


def _judges_bounds(source: str) -> bool:
    """Whether ``source`` names ``judge_bound`` in code (a call or an import; prose in docstrings aside)."""
    return any(isinstance(node, ast.Name) and node.id == "judge_bound"
               or isinstance(node, ast.Attribute) and node.attr == "judge_bound"
               or isinstance(node, ast.ImportFrom) and any(a.name == "judge_bound" for a in node.names)
               for node in ast.walk(_parse(source)))


@for_each_module(sorted(set(MODULES) - {"core.records.stats", "core.method.judge", "core.analyses.error_rates"}))
def test_only_the_judge_decides_a_timed_bound(name):
    # One rule says whether rounds keep or miss a timed budget (stats.judge_bound), and only the judge asks it: every
    # reader of a timed verdict (the summary, the gate, a stop of the rounds one day) takes the judge's. The one
    # other caller is the simulation that measures how often that rule errs (core.analyses.error_rates), by design.
    assert not _judges_bounds(MODULES[name].read_text()), f"{name}.py judges a timed bound itself (ask core.method.judge)"


def test_the_bound_check_sees_what_it_forbids():
    assert _judges_bounds("from trainbench.core.records.stats import judge_bound")
    assert _judges_bounds("ok, why = stats.judge_bound('samples_per_s', 'min', 1.0, 1.1, [1], None, True, [])")
    assert not _judges_bounds('"""rounds judged by ``stats.judge_bound``"""')


# PyTorch's module trackers register backward hooks whose closures hold the autograd nodes they hang on: a cycle no
# collector sees, which kept each case's model and gradients alive (on a GPU, in every later case's peak).
MODULE_TRACKERS = re.compile(r"\b(?:FSDPMemTracker|MemTracker|ModTracker)\(")


def _tracker_without_hook_removal(source: str) -> bool:
    return bool(MODULE_TRACKERS.search(source)) and "module_grad_hooks_removed(" not in source


@for_each_module(sorted(MODULES))
def test_every_module_tracker_runs_with_its_backward_hooks_removed(name):
    assert not _tracker_without_hook_removal(MODULES[name].read_text()), (
        f"{name}.py makes a MemTracker/ModTracker without attribution.module_grad_hooks_removed(): each step it tracks "
        "would keep its graph, model and gradients alive")


def test_the_tracker_check_sees_a_tracker_left_with_its_hooks():
    assert _tracker_without_hook_removal("tracker = MemTracker()\nwith tracker:\n    step()")
    assert _tracker_without_hook_removal("self._modules = ModTracker()")
    assert not _tracker_without_hook_removal("with module_grad_hooks_removed(), MemTracker() as t:\n    step()")
    assert not _tracker_without_hook_removal("from torch.distributed._tools.mod_tracker import ModTracker")


# A timed verdict judged again after more rounds is a second chance to err: every judgement of one names the share of
# the error its look may spend (stats.look_alpha), or the looks would claim more often than one look (issue: a
# re-measured case judged at the full 2.5% each time).
def _judgements_without_look_share(source: str) -> list[int]:
    return [node.lineno for node in ast.walk(_parse(source))
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
            in {"judge_change", "judge_bound"} and not any(k.arg == "alpha_side" for k in node.keywords)]


@for_each_module(sorted(set(MODULES) - {"core.records.stats"}))
def test_every_timed_judgement_spends_only_its_looks_share_of_the_error(name):
    lines = _judgements_without_look_share(MODULES[name].read_text())
    assert not lines, f"{name}.py judges a timed verdict without alpha_side= (its look's share) at lines {lines}"


def test_the_look_share_check_sees_what_it_forbids():
    assert _judgements_without_look_share("v = judge_change(ci, 0.1, 0.1, 0.05, True, 0.05)") == [1]
    assert not _judgements_without_look_share("v = stats.judge_change(ci, 0.1, 0.1, 0.05, True, 0.05, alpha_side=a)")


# A process forked from the session inherits its locks, its CUDA context and its autograd threads: one module forks,
# and only after asking whether it is safe here (predict_ahead.why_not_forked, its children's autograd_refused).
FORKS = re.compile(r"""\bos\.fork\(|get_context\(\s*["']fork["']|set_start_method\(\s*["']fork["']""")


def _forks(source: str) -> bool:
    return bool(FORKS.search(source))


@for_each_module(sorted(set(MODULES) - {"core.method.predict_ahead"}))
def test_only_the_predictions_made_ahead_fork_the_session(name):
    assert not _forks(MODULES[name].read_text()), f"{name}.py forks the session (only core.method.predict_ahead may)"


def test_the_fork_check_sees_what_it_forbids():
    assert _forks("pid = os.fork()") and _forks('context = multiprocessing.get_context("fork")')
    assert _forks("mp.set_start_method('fork')")
    assert not _forks('context = multiprocessing.get_context("spawn")') and not _forks("# forked children")
    assert _forks(MODULES["core.method.predict_ahead"].read_text())  # the one module that does


# pytest-benchmark's own options are read once, into plugin.options.BenchmarkOptions; what pytest-benchmark does
# with them (its storage, its comparison) is the adapter's.
BENCHMARK_OPTION = re.compile(r"""getoption\(\s*["']-*benchmark[_-]""")


def _reads_benchmark_options(source: str) -> bool:
    return bool(BENCHMARK_OPTION.search(source))


@for_each_module(sorted(set(MODULES) - {"plugin.options", "plugin.benchmark_adapter"}))
def test_pytest_benchmarks_options_are_read_once_into_the_options(name):
    assert not _reads_benchmark_options(MODULES[name].read_text()), (
        f"{name}.py reads a pytest-benchmark option itself (read Options.benchmark)")


def test_the_benchmark_option_check_sees_what_it_forbids():
    assert _reads_benchmark_options('storage = config.getoption("benchmark_storage", None)')
    assert _reads_benchmark_options("config.getoption('--benchmark-json')")
    assert not _reads_benchmark_options('config.getoption("--trainbench-ab")')


def _classes_over(source: str, limit: int) -> list[tuple[str, int]]:
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(_parse(source))
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > limit]


# A class holds one responsibility; past 250 lines it holds several (split it by what its state is for).
@for_each_module(sorted(MODULES))
def test_no_class_is_over_250_lines(name):
    assert not _classes_over(MODULES[name].read_text(), 250), f"{name}.py: a class over 250 lines"


def test_the_class_size_check_sees_a_long_class():
    assert _classes_over("class A:\n" + "    x = 1\n" * 250, 250) == [("A", 251)]
    assert not _classes_over("class A:\n" + "    x = 1\n" * 249, 250)


def _local_imports(source: str) -> list[tuple[int, bool]]:
    """(line, whether a comment says why) for each import inside a function: on its lines or the line above."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(_parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    found.append((sub.lineno, _said_why(lines, sub.lineno - 1, sub.end_lineno)))
    return found


def _said_why(lines: list[str], first: int, end: int) -> bool:
    """Whether a comment stands on an import's lines, or above the block of imports it belongs to."""
    if any("#" in line for line in lines[first:end]):
        return True
    above = first - 1
    while above >= 0 and (lines[above].strip().startswith(("import ", "from ")) or not lines[above].strip()):
        if "#" in lines[above]:
            return True
        above -= 1
    return above >= 0 and lines[above].strip().startswith("#")


# An import inside a function is invisible to a reader of the module's top: the exception, for a reason said beside
# it (a heavy or optional package only one path needs, a module that must stay torch-free, a cycle it avoids).
MAX_LOCAL_IMPORTS = 60


def test_function_local_imports_are_few_and_each_says_why():
    found = {name: _local_imports(path.read_text()) for name, path in MODULES.items()}
    total = sum(len(imports) for imports in found.values())
    assert total <= MAX_LOCAL_IMPORTS, f"{total} function-local imports: " + ", ".join(
        f"{name} {len(imports)}" for name, imports in sorted(found.items(), key=lambda item: -len(item[1])) if imports)
    unexplained = [f"{name}.py:{line}" for name, imports in found.items() for line, said in imports if not said]
    assert not unexplained, f"function-local imports without a reason beside them: {unexplained}"


def test_the_local_import_check_sees_an_import_without_a_reason():
    assert _local_imports("def f():\n    import torch\n") == [(2, False)]
    assert _local_imports("def f():\n    import torch  # only this path trains\n") == [(2, True)]
    assert _local_imports("def f():\n    # scipy: only the exact test needs it\n    import scipy\n") == [(3, True)]
    assert _local_imports("import torch\n\n\ndef f():\n    return torch\n") == []
    block = "def f():\n    # torch: only this path trains\n    import torch\n\n    from torch import nn\n    return nn\n"
    assert _local_imports(block) == [(3, True), (5, True)]  # one reason for the block
    assert _local_imports("def f():\n    x = 1\n    import torch\n") == [(3, False)]
