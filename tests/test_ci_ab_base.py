""".ci/ab-base (make ab-base): which commit is the base, its worktree, when its venv is built, reused or only given
the base's trainbench, and the A/B command it runs.

Each test runs the script in a temporary git repository with a stand-in Python that records its calls: ``-m venv``
makes a venv of stand-ins, ``-m pip freeze`` prints the head's pins, ``-m pip install`` and ``-m pytest`` only
record. No network, no real install.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "ab-base"
FREEZE = "numpy==2.1.0\ntorch==2.14.1\ntorchvision==0.29.1\nnvidia-cublas==13.0.0\npytest-trainbench==0.1.0\nscipy==1.15.2\n"
STAND_IN = """#!/usr/bin/env bash
echo "$0 $*" >> "$FAKE_LOG"
case "$1 $2 $3" in
    "--version  ") echo "Python 3.11.0" ;;
    "-m venv "*) mkdir -p "$3/bin" && cp "$0" "$3/bin/python" ;;
    "-m pip freeze") printf '%s' "$FAKE_FREEZE" ;;
    "-m pip install") for a in "$@"; do [ "$a" = "$FAKE_PIP_FAIL_ON" ] && exit 1; done; true ;;
    "-m pytest "*) true ;;
    *) echo "unexpected: $*" >&2; exit 3 ;;
esac
"""


class Repo:
    """A git repository holding the script, and the stand-in Python's log."""

    def __init__(self, path: Path):
        self.path, self.log = path, path.parent / "calls.log"
        bin_dir = path.parent / "bin"
        bin_dir.mkdir()
        self.python = bin_dir / "python"
        self.python.write_text(STAND_IN)
        self.python.chmod(0o755)
        path.mkdir()
        (path / ".ci").mkdir()
        shutil.copy(SCRIPT, path / ".ci" / "ab-base")
        (path / ".gitignore").write_text(".trainbench-base/\n")
        self.env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                    "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_NOSYSTEM": "1", "FAKE_LOG": str(self.log),
                    "FAKE_FREEZE": FREEZE, "FAKE_PIP_FAIL_ON": "", "PYTHON": str(self.python),
                    "HEAD_PYTHON": str(self.python), "TORCH_PKGS": "torch==2.14.1 torchvision==0.29.1"}
        for name in ("BASE", "UPSTREAM", "AB_BASE_TORCH_PKGS", "AB_FAIL", "AB_ARGS", "AB_OUT", "AB_DIR"):
            self.env.pop(name, None)
        self.git("init", "-q", "-b", "main")

    def git(self, *args: str) -> str:
        return subprocess.run(["git", *args], cwd=self.path, env=self.env, check=True, capture_output=True,
                              text=True).stdout.strip()

    def commit(self, name: str, pyproject: str = "[project]\nname = 'x'\n") -> str:
        (self.path / "pyproject.toml").write_text(pyproject)
        (self.path / "code.py").write_text(name)
        self.git("add", "-A")
        self.git("commit", "-qm", name)
        return self.git("rev-parse", "HEAD")

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        self.log.write_text("")
        return subprocess.run([str(self.path / ".ci" / "ab-base"), *args], cwd=self.path, env={**self.env, **env},
                              check=False, capture_output=True, text=True, timeout=60)

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()

    @property
    def venv_python(self) -> Path:
        return self.path / ".trainbench-base" / "venv" / "bin" / "python"


@pytest.fixture
def repo(tmp_path) -> Repo:
    return Repo(tmp_path / "repo")


def test_the_base_is_the_merge_base_with_upstream(repo):
    fork = repo.commit("fork point")
    repo.git("checkout", "-q", "-b", "topic")
    repo.commit("the change")
    repo.git("checkout", "-q", "main")
    main_tip = repo.commit("main moved on")
    repo.git("update-ref", "refs/remotes/origin/main", main_tip)
    repo.git("checkout", "-q", "topic")
    assert repo.run("base").stdout.strip() == fork
    assert repo.run("base", UPSTREAM="main").stdout.strip() == fork
    assert repo.run("base", BASE="main").stdout.strip() == main_tip  # a given ref is taken as it is


def test_without_upstream_the_base_is_the_previous_commit(repo):
    first = repo.commit("first")
    repo.commit("second")
    assert repo.run("base").stdout.strip() == first


def test_no_base_at_all_or_an_unknown_ref_fails_with_one_line(repo):
    repo.commit("only")
    for result in (repo.run("base"), repo.run("run"), repo.run("base", BASE="no-such-ref")):
        assert result.returncode != 0 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert result.stderr.startswith("ab-base: ")
    assert "give BASE=<git ref>" in repo.run("base").stderr
    assert "BASE=no-such-ref: no such commit" in repo.run("base", BASE="no-such-ref").stderr


def test_a_run_builds_the_base_venv_with_the_heads_pins_and_runs_the_ab_gate(repo):
    base = repo.commit("base")
    head = repo.commit("head")
    result = repo.run("run", AB_ARGS="-k resnet18 --trainbench-ab-pairs=8")
    assert result.returncode == 0, result.stderr
    tree = repo.path / ".trainbench-base" / base[:12]
    assert (tree / "code.py").read_text() == "base" and (repo.path / "code.py").read_text() == "head"
    venv = repo.path / ".trainbench-base" / "venv"
    calls = repo.calls()
    assert f"{repo.python} -m venv {venv}" in calls
    assert f"{repo.venv_python} -m pip install --quiet torch==2.14.1 torchvision==0.29.1" in calls
    assert (f"{repo.venv_python} -m pip install --quiet --constraint {repo.path}/.trainbench-base/pins.txt "
            f"-e {tree}") in calls
    # Every dependency at the head's version, trainbench itself from the base's worktree
    assert (repo.path / ".trainbench-base" / "pins.txt").read_text() == FREEZE.replace("pytest-trainbench==0.1.0\n", "")
    assert calls[-1] == (f"{repo.python} -m pytest benchmarks -rs --trainbench-ab-base={repo.venv_python} "
                         f"--trainbench-ab={repo.python} --trainbench-compare-fail=step_time_ms:5%,cpu_time_ms:5% "
                         f"--trainbench-compare-json=results/ci/ab-verdict.json -k resnet18 --trainbench-ab-pairs=8")
    assert base in result.stdout and head in result.stdout
    assert repo.git("status", "--porcelain") == ""  # the worktree and venv are ignored


def test_the_venv_is_reused_while_its_key_holds_and_rebuilt_when_it_changes(repo):
    first = repo.commit("first")
    second = repo.commit("second")
    repo.commit("head")
    assert repo.run("run", BASE=first).returncode == 0

    def pip_installs() -> list[str]:
        return [c for c in repo.calls() if " -m pip install" in c or " -m venv" in c]

    assert repo.run("run", BASE=first).returncode == 0
    assert pip_installs() == []  # same base, same key: nothing installed
    assert repo.run("run", BASE=second).returncode == 0
    tree = repo.path / ".trainbench-base" / second[:12]
    assert pip_installs() == [f"{repo.venv_python} -m pip install --quiet --no-deps -e {tree}"]
    assert not (repo.path / ".trainbench-base" / first[:12]).exists()  # the earlier base's worktree is removed
    assert first[:12] not in repo.git("worktree", "list")
    for env in ({"FAKE_FREEZE": FREEZE.replace("numpy==2.1.0", "numpy==2.2.0")},  # the head's pins moved
                {"TORCH_PKGS": "torch==2.9.1 torchvision==0.24.1"}):  # another torch build
        assert repo.run("run", BASE=second, **env).returncode == 0
        assert any(" -m venv " in c for c in pip_installs()), env
    repo.commit("head with new dependencies", pyproject="[project]\nname = 'x'\ndependencies = ['rich']\n")
    repo.commit("head")
    assert repo.run("run", BASE="HEAD~1", TORCH_PKGS="torch==2.9.1 torchvision==0.24.1").returncode == 0
    assert any(" -m venv " in c for c in pip_installs())  # the base's pyproject.toml changed the key


def test_a_failed_install_is_never_reused(repo):
    repo.commit("base")
    repo.commit("head")
    failed = repo.run("run", FAKE_PIP_FAIL_ON="--constraint")
    assert failed.returncode != 0 and "does not install with the head's dependency versions" in failed.stderr
    assert not any("-m pytest" in c for c in repo.calls())
    assert repo.run("run").returncode == 0
    assert any(" -m venv " in c for c in repo.calls())


def test_another_torch_for_the_base_leaves_the_torch_family_unpinned(repo):
    repo.commit("base")
    repo.commit("head")
    assert repo.run("run", AB_BASE_TORCH_PKGS="torch==2.9.1 torchvision==0.24.1").returncode == 0
    assert f"{repo.venv_python} -m pip install --quiet torch==2.9.1 torchvision==0.24.1" in repo.calls()
    assert (repo.path / ".trainbench-base" / "pins.txt").read_text() == "numpy==2.1.0\nscipy==1.15.2\n"


def test_the_key_command_prints_the_key_the_venv_is_built_under(repo):
    repo.commit("base")
    repo.commit("head")
    key = repo.run("key").stdout.strip()
    assert len(key) == 16
    assert repo.run("run").returncode == 0
    assert (repo.path / ".trainbench-base" / "venv" / ".key").read_text().strip() == key
    assert repo.run("key", TORCH_PKGS="torch==2.9.1").stdout.strip() != key
