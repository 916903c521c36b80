"""A user's project as its own pytest reads it, for ``python -m trainbench calibrate``: where pytest-benchmark keeps
its runs and which budgets file the plugin finds for each test file.

Nothing here re-reads pytest's configuration by hand (rootdir, ini files, ``addopts``): pytest is asked, in a
process of its own started in the current folder with the arguments the user would give it, with this module
loaded as a plugin (``-p trainbench.plugin.project``). It writes what that pytest resolved to a JSON file and stops
before collecting anything. Which budgets file applies to a test file is the plugin's own rule
(``options.discover_budgets``, or the one file ``--trainbench-budgets``/``trainbench_budgets`` names).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainbench.devices.host import env_value
from trainbench.plugin.fixture import SESSION
from trainbench.plugin.options import BUDGETS_FILE, discover_budgets
from trainbench.verdicts.store import latest_run, matching_runs, storage_folder

PROBE_ENV = "TRAINBENCH_PROJECT_PROBE"  # where the probing pytest writes what it resolved
DEFAULT_STORAGE = "file://./.benchmarks"  # pytest-benchmark's own default for --benchmark-storage


class ProjectError(Exception):
    """The project's pytest configuration cannot be read; the message says what pytest said."""


@dataclass(frozen=True)
class Project:
    rootpath: Path  # pytest's rootdir
    inipath: Path | None  # the configuration file pytest read (None: none)
    storage: str  # --benchmark-storage as pytest-benchmark reads it (relative paths: from the current folder)
    budgets_override: Path | None  # the one budgets file --trainbench-budgets or the trainbench_budgets ini names

    @property
    def runs_folder(self) -> Path | None:
        """pytest-benchmark's folder of this machine's runs (None: not a file storage)."""
        return storage_folder(self.storage)

    def describe_storage(self) -> str:
        where = ("pytest-benchmark's default" if self.storage == DEFAULT_STORAGE else
                 f"--benchmark-storage={self.storage}" + (f" from {self.inipath.name}" if self.inipath else ""))
        return f"{self.runs_folder} ({where})"

    def budgets_files(self, test_files: list[Path]) -> dict[Path, tuple[Path, str]]:
        """Each test file's budgets file, and how it was chosen: the one the plugin finds for it; where it finds none,
        a new ``budgets.toml`` in the deepest folder above all such test files, which the plugin then finds for
        each of them."""
        if self.budgets_override is not None:
            return {f: (self.budgets_override, "named by the project's pytest configuration") for f in test_files}
        chosen, without = {}, []
        for test_file in test_files:
            found = discover_budgets(test_file, self.rootpath)
            if found is None:
                without.append(test_file)
            else:
                chosen[test_file] = (found, "found by the plugin")
        if without:
            folder = Path(os.path.commonpath([f.parent for f in without]))
            if folder != self.rootpath and self.rootpath not in folder.parents:
                folder = self.rootpath
            new = folder / BUDGETS_FILE
            for test_file in without:  # the rule that will read it agrees, or this is the wrong place for it
                if test_file.parent != folder and folder not in test_file.parents:
                    raise ProjectError(f"{test_file}: outside pytest's rootdir {self.rootpath}: the plugin would find "
                                       "no budgets file for it; pass --budgets")
                chosen[test_file] = (new, "new: the plugin will find it")
        return chosen


    def newest_run(self) -> Path:
        """The newest run saved on this machine in the project's storage: what the last ``pytest --benchmark-save``
        there wrote (never another machine's)."""
        folder = self.runs_folder
        if folder is None:
            raise ProjectError(f"--benchmark-storage={self.storage}: not a file storage, which calibrate reads; pass "
                               "RUN_JSON (--benchmark-json=FILE)")
        # loads torch: not at the top, where the probing pytest this module is a plugin of would load it too
        from trainbench.devices.device import comparable_device, get_backend

        # this machine's device: a GPU box's CPU run (or the reverse) would write the other device's section
        return latest_run(folder.parent, device_here=lambda: comparable_device(get_backend(None).identity()))

    def budgets_targets(self, chosen: dict[Path, tuple[Path, str]]) -> Callable[[list[str]], dict[str, Path]]:
        """Each case's budgets file by its pytest-benchmark fullname (its test's node id, relative to the rootdir):
        the one the plugin finds for its test file, or a new one it will find (``budgets_files``). ``chosen``
        collects the choices: test file -> (budgets file, how it was chosen)."""

        def targets(fullnames: list[str]) -> dict[str, Path]:
            unknown = [name for name in fullnames if "::" not in name]
            if unknown:
                raise ProjectError(f"{unknown[0]}: the run does not say which test measured it (no pytest node id as "
                                   "its fullname); pass --budgets FILE")
            test_files = {name: self.rootpath / name.split("::")[0] for name in fullnames}
            chosen.update(self.budgets_files(sorted(set(test_files.values()))))
            return {name: chosen[test_file][0] for name, test_file in test_files.items()}

        return targets


def read_project(pytest_args: list[str] | tuple[str, ...] = (), python: str = sys.executable) -> Project:
    """The project in the current folder as ``python -m pytest PYTEST_ARGS`` would configure it."""
    with tempfile.TemporaryDirectory(prefix="trainbench-project-") as folder:
        out = Path(folder) / "project.json"
        command = [python, "-m", "pytest", "-p", "trainbench.plugin.project", "--collect-only", "-q", *pytest_args]
        done = subprocess.run(command, env={**os.environ, PROBE_ENV: str(out)}, capture_output=True, text=True,
                              check=False)
        if not out.is_file():
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-5:]
            raise ProjectError("pytest could not read the project's configuration (exit status "
                               f"{done.returncode}): " + " / ".join(said))
        found = json.loads(out.read_text(encoding="utf-8"))
    if found.get("error"):
        raise ProjectError(found["error"])
    return Project(Path(found["rootpath"]), Path(found["inipath"]) if found["inipath"] else None, found["storage"],
                   Path(found["budgets_override"]) if found["budgets_override"] else None)


MEASURED_RUN = "calibrate"  # the name of the run ``measure_run`` saves (NNNN_calibrate.json)
PAIR_OPTION = "--trainbench-pair-baselines"


def measure_run(project: Project, pytest_args: list[str] | tuple[str, ...] = (), python: str = sys.executable) -> Path:
    """Run the project's tests with every case timed interleaved with its baseline, saved into its storage: the
    saved run. pytest's own output goes to the terminal. A run whose tests failed (a budget, a guard) is still
    a run; one that saved nothing (a usage error, an interruption, no trainbench case) is a ``ProjectError``."""
    folder = project.runs_folder
    if folder is None:
        raise ProjectError(f"--benchmark-storage={project.storage}: not a file storage, which calibrate reads; measure "
                           f"with --benchmark-json=FILE and pass FILE")
    before = set(matching_runs(folder))
    command = [python, "-m", "pytest", *pytest_args, PAIR_OPTION, f"--benchmark-save={MEASURED_RUN}"]
    print("measuring: " + shlex.join(command), flush=True)
    status = subprocess.run(command, check=False).returncode
    new = [path for path in matching_runs(folder) if path not in before]
    if not new or status not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        what = f"saved no run in {folder}" if not new else f"its run {new[-1]} is not the whole project's"
        raise ProjectError(f"pytest exited with status {status} and {what}: nothing to calibrate from")
    if status == pytest.ExitCode.TESTS_FAILED:
        print("some tests failed: calibrating from what was measured (a case whose guard failed is left out)",
              flush=True)
    return new[-1]


# -- the probe: hooks of the pytest that ``read_project`` starts (inert unless it loads this module) -------------

@pytest.hookimpl(tryfirst=True)
def pytest_collection(session):
    """Write what this pytest resolved, then collect nothing (no test module is imported)."""
    out = env_value(PROBE_ENV)
    if not out:
        return None
    config = session.config
    state = config.stash.get(SESSION, None)  # trainbench's session, where its plugin is active
    storage = state.options.benchmark.storage if state is not None else None
    error = ("trainbench's pytest plugin is not active in this project (-p no:trainbench?)" if state is None else
             "pytest-benchmark is not active in this project" if storage is None else None)
    override = state.options.budgets_override if state is not None else None
    Path(out).write_text(json.dumps({
        "rootpath": str(config.rootpath), "inipath": str(config.inipath) if config.inipath else None,
        "storage": storage, "error": error,
        "budgets_override": str(Path(config.invocation_params.dir, override)) if override else None,
    }), encoding="utf-8")
    return True
