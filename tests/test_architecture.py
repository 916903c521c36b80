"""The library's shape: device specifics in one module, no import cycles, a plugin that stays glue."""

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
    glue = {"plugin", "__main__"}
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
