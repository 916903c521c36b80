"""python -m trainbench bisect: the search finds the first bad commit in ceil(log2(N)) steps, never names a wrong one
(skipped commits, a step that cannot tell), continues from its log; and on a planted repository of a user project,
the exact search names the commit that added a layer and the timed one the commit that slowed the step, or says it
cannot tell."""

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainbench.verdicts.bisect import BAD, GOOD, SKIP, UNDECIDED, BisectLog, Commit, Search, Step
from trainbench.jobs.bisect_runs import judged

COMMITS = [Commit(f"{i:040x}", f"commit {i}") for i in range(64)]


def _run(commits, first_bad, skipped=frozenset(), undecided=frozenset()):
    search, probed = Search(commits), []
    while (commit := search.next()) is not None:
        i = commits.index(commit)
        probed.append(i)
        verdict = SKIP if i in skipped else UNDECIDED if i in undecided else BAD if i >= first_bad else GOOD
        search.record(Step(commit.sha, verdict, "seen"))
    return search.answer(), probed


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 64).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))))
def test_the_first_bad_commit_is_found_in_ceil_log2_steps(case):
    n, first_bad = case
    answer, probed = _run(COMMITS[:n], first_bad)
    assert answer.first_bad == COMMITS[first_bad]
    assert len(probed) <= math.ceil(math.log2(n)) and len(set(probed)) == len(probed)
    assert answer.last_good == (COMMITS[first_bad - 1] if first_bad else None)


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 40).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1),
                                                       st.frozensets(st.integers(0, n - 2)),
                                                       st.frozensets(st.integers(0, n - 2), max_size=1))))
def test_skipped_and_undecided_commits_never_make_a_wrong_answer(case):
    n, first_bad, skipped, undecided = case
    answer, _ = _run(COMMITS[:n], first_bad, skipped, undecided - skipped)
    if answer.first_bad is not None:
        assert answer.first_bad == COMMITS[first_bad] and answer.stopped is None
    else:  # it says where it stands: the first bad commit is among the open ones, and why it stopped
        assert COMMITS[first_bad] in answer.open and answer.stopped


def test_a_step_that_cannot_tell_stops_the_search_and_says_where_it_stands():
    search = Search(COMMITS[:8])
    search.record(Step(search.next().sha, GOOD, "unchanged"))  # commit 3
    assert search.next() == COMMITS[5]
    search.record(Step(COMMITS[5].sha, UNDECIDED, "step_time_ms +3.0% inconclusive"))
    answer = search.answer()
    assert search.next() is None and answer.first_bad is None
    assert answer.open == tuple(COMMITS[4:8]) and answer.last_good == COMMITS[3]
    assert answer.stopped == f"{COMMITS[5].short} could not be judged: step_time_ms +3.0% inconclusive"


def test_the_log_continues_an_interrupted_search(tmp_path):
    log = BisectLog(tmp_path / "log.jsonl", {"good": "g"})
    search = Search(COMMITS[:16])
    for verdict in (GOOD, BAD):
        step = Step(search.next().sha, verdict, "seen", COMMITS[0].sha, 1.5, ("why",))
        search.record(step)
        log.append(step)
    with open(log.path, "a") as f:
        f.write('{"commit": "cut sho')  # interrupted while writing
    steps, note = log.read()
    assert steps == search.steps and note.endswith("a step that was not written whole (interrupted?): judged again")
    resumed = Search(COMMITS[:16], steps)
    assert resumed.next() == search.next()  # nothing judged again
    log.append(Step(resumed.next().sha, GOOD, "seen"))
    steps, _ = log.read()
    assert len(steps) == 3 and json.loads(log.path.read_text().splitlines()[0]) == {"bisect": {"good": "g"}}


def test_a_step_is_bad_only_where_the_metric_regressed_and_undecided_where_it_could_not_be_judged():
    from trainbench.verdicts.gate import MetricComparison

    def row(metric, verdict):
        return MetricComparison("c", metric, 1.0, 1.1, 0.1, 0.05, verdict, reason="why")

    def verdict(*rows):
        return {"comparisons": [row(m, v).to_json() for m, v in rows]}

    assert judged(verdict(("param_mib", "regressed"), ("ops_per_step", "unchanged")), ["param_mib"], [])[0] == BAD
    assert judged(verdict(("ops_per_step", "unchanged"), ("param_mib", "regressed"), ("grad_mib", "unchanged")),
                  ["param_mib", "ops_per_step", "grad_mib"], [])[:2] == (
        BAD, row("param_mib", "regressed").describe() + " (and 2 more: 2 unchanged)")  # the deciding row, as printed
    assert row("param_mib", "regressed").describe().startswith("c param_mib: 1 -> 1.1 MiB (+10.0%) regressed")
    assert judged(verdict(("param_mib", "unchanged")), ["param_mib"], [])[0] == GOOD
    assert judged(verdict(("param_mib", "improved")), ["param_mib"], [])[0] == GOOD
    assert judged(verdict(("step_time_ms", "inconclusive")), ["step_time_ms"], [])[:2] == (
        UNDECIDED, row("step_time_ms", "inconclusive").describe())
    assert row("step_time_ms", "inconclusive").describe().endswith(" inconclusive (threshold 5.0%): why")
    assert judged(verdict(("param_mib", "missing")), ["param_mib"], [])[0] == UNDECIDED
    assert judged(verdict(("ops_per_step", "regressed")), ["param_mib"], [])[0] == UNDECIDED  # not compared at all


# -- a planted repository of a user project ---------------------------------------------------------------------------

MODEL = """
import torch
from torch import nn

LAYERS = {layers}
SLOW = {slow}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(*[nn.Linear(256, 256) for _ in range(LAYERS)])
        self.head = nn.Linear(256, 10)

    def forward(self, x):
        for _ in range(SLOW):  # a slowed op: the same result, computed again
            x = x + 0.0 * torch.tanh(x @ x.T @ x)
        return self.head(self.body(x))
"""

TEST = """
import functools

import torch

from model import Net
from trainbench.core.setups.spec import TrainingSpec, classification_loss


def batches(batch_size, gen):
    return torch.randn(batch_size, 256, generator=gen), torch.randint(0, 10, (batch_size,), generator=gen)


SPEC = TrainingSpec(name="net", model=Net, loss_fn=classification_loss, batches=batches, batch_size=256,
                    optimizer=functools.partial(torch.optim.SGD, lr=0.01))


def test_net(train_bench):
    train_bench("baseline", SPEC)
"""

# Each commit a search judges costs a pytest run (exact) or an A/B session of three processes (timed), each ~4 s CPU
# of imports: the histories are as short as lets each search show what its test asserts.
# The exact search over commits 2..5 (commit 1 good): commit 3 first (the middle), which does not import and is
# skipped, then commit 2, bad: found past the skipped one in four runs (commits 1, 5, 3, 2; the change across the
# answer is against commit 1's run, already made).
LAYER_COMMITS, LAYER_AT, BROKEN_AT = 5, 2, 3
# The timed search over commits 2..3: one step, the A/B of commit 2 (slowed) against commit 1, two real regressions
# in all (BAD against GOOD first), none an A/A that a loaded machine could leave undecided.
SLOW_COMMITS, SLOW_AT = 3, 2


def _planted_repo(root, change, commits, planted_at, broken_at=None):
    """``commits`` commits of a user project; commit ``planted_at`` makes its model ``change`` (more layers, or a
    slower step); commit ``broken_at`` alone has a test module that does not import."""
    def git(*args):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)

    root.mkdir()
    git("init", "-q", "-b", "main")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    shas = []
    for i in range(1, commits + 1):
        layers, slow = (2, 0) if i < planted_at else change
        (root / "model.py").write_text(MODEL.format(layers=layers, slow=slow))
        # the failing import first: the broken commit's run stops before it loads torch
        (root / "test_speed.py").write_text(("import not_a_module\n" if i == broken_at else "") + TEST)
        (root / "notes.txt").write_text(f"commit {i}\n")
        git("add", "-A")
        git("commit", "-q", "-m", f"commit {i}")
        shas.append(subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True, capture_output=True,
                                   text=True).stdout.strip())
    return shas


@pytest.fixture(scope="module")
def layer_repo(tmp_path_factory):
    """The planted repository whose commit 2 adds a layer and whose commit 3 alone does not import: built once for
    the tests that search it and those refused before any run (the refusals read its commits, never its tree)."""
    root = tmp_path_factory.mktemp("layer") / "project"
    return root, _planted_repo(root, change=(3, 0), commits=LAYER_COMMITS, planted_at=LAYER_AT, broken_at=BROKEN_AT)


def _bisect(root, *args):
    # One intra-op thread, as in make test: two A/B sides of two threads each on two shared cores time each other's
    # thread wake-ups (pairs alternating +-40% in A/A runs of a 3 ms step). Set for every process of the search (each
    # side gets its session's count), not in the project's conftest: importing torch there, the broken commit's run
    # would load it before its test module fails.
    env = {**os.environ, "TRAINBENCH_PREDICT_MEMORY": "0", "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-m", "trainbench", "bisect", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)


def test_the_exact_search_finds_the_commit_that_added_a_layer_past_one_that_does_not_run(layer_repo, tmp_path,
                                                                                          monkeypatch, capsys):
    root, shas = layer_repo
    quick = ["--pytest-arg=--trainbench-rounds=2", "--pytest-arg=--trainbench-steps-per-round=1",
             "--pytest-arg=--trainbench-min-warmup=1", "--pytest-arg=--trainbench-no-predict"]
    args = [shas[0], shas[-1], *quick, "--json", str(tmp_path / "answer.json")]
    done = _bisect(root, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    answer = json.loads((tmp_path / "answer.json").read_text())
    assert answer["first_bad"]["sha"] == shas[LAYER_AT - 1] and f"commit {LAYER_AT}" in answer["first_bad"]["subject"]
    assert len(answer["steps"]) <= math.ceil(math.log2(len(shas) - 1)) + 1
    assert "param_mib" in answer["metrics"]  # found from GOOD and BAD: the metrics worse at BAD
    assert any(line.startswith(f"first bad commit: {shas[LAYER_AT - 1][:12]} commit {LAYER_AT}") for line in lines)
    assert any("param_mib" in line and "->" in line for line in lines)  # the change at each step and across it
    skipped = [line for line in lines if line.startswith("  step ") and line.endswith(" s)") and ": skip (" in line]
    assert len(skipped) == 1 and f"{shas[BROKEN_AT - 1][:12]} commit {BROKEN_AT}: pytest exited 2: " in skipped[0]  # as git bisect skip
    assert lines[-1].startswith("trainbench bisect: found in ")
    status = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True)
    assert status.stdout == "" and not (root / ".benchmarks").exists()  # the working tree untouched, nothing saved
    worktrees = subprocess.run(["git", "-C", str(root), "worktree", "list"], capture_output=True, text=True).stdout
    assert len(worktrees.splitlines()) == 1  # the checkouts removed
    # The searches below run nothing (they read the log and the runs above): in this process, the repository here.
    from trainbench.cli import main

    monkeypatch.chdir(root)
    capsys.readouterr()
    # A rerun of the same search continues from its log: nothing judged again, the same answer.
    status, again = main(["bisect", *args]), capsys.readouterr().out
    assert status == 0 and f"first bad commit: {shas[LAYER_AT - 1][:12]}" in again
    assert not any(line.startswith("  step ") for line in again.splitlines())
    # Searched by a metric the commits did not change (the runs read again): nothing to search, and it says so.
    status, unchanged = main(["bisect", shas[0], shas[-1], "--metric=syncs_per_step", *quick]), capsys.readouterr().out
    assert status == 1 and not any(line.startswith("  step ") for line in unchanged.splitlines())
    assert unchanged.splitlines()[-1] == (f"trainbench bisect: FAILED to find the commit: {shas[-1][:12]} is not "
                                          f"worse than {shas[0][:12]} by the metric (good): nothing to search")


def test_bad_input_is_one_line_before_any_run(layer_repo, monkeypatch, capsys):
    # In this process (the refusals come before any run; the searches above start the command as a user does): each
    # start of python -m trainbench was most of this test's time.
    from trainbench.cli import main

    root, shas = layer_repo
    monkeypatch.chdir(root)  # the repository here, as the command's default --repo "." reads it
    for args, expected in (((shas[-1], shas[0]), "is not an ancestor of"),
                           (("nope", shas[0]), "nope: not a commit of"),
                           ((shas[0], shas[-1], "--metric=nope"), "unknown metric 'nope'"),
                           ((shas[0], shas[-1], "--metric=param_mib", "--metric=step_time_ms"), "not both"),
                           ((shas[0], shas[-1], "--pairs=3"), "--pairs=3: expected at least 7"),
                           ((shas[0], shas[-1], "--remeasure-s=-1"), "--remeasure-s=-1: expected seconds >= 0"),
                           ((shas[0], shas[-1], f"--workdir={root / 'test_speed.py'}"), "cannot write there")):
        status = main(["bisect", *args])
        out, err = capsys.readouterr()
        assert status == 2 and len(err.strip().splitlines()) == 1, err
        assert expected in err and out == ""


def test_the_timed_search_finds_the_commit_that_slowed_the_step_or_says_it_cannot_tell(tmp_path):
    # Timing on a shared machine may not settle: an answer must be the planted commit, or none with the planted one
    # still open; never another commit.
    root = tmp_path / "project"
    shas = _planted_repo(root, change=(2, 2), commits=SLOW_COMMITS, planted_at=SLOW_AT)
    done = _bisect(root, shas[0], shas[-1], "--metric=step_time_ms", "--threshold=10%", "--remeasure-s=20",
                   "--pytest-arg=--trainbench-min-warmup=1", "--pytest-arg=--trainbench-steps-per-round=5",
                   "--json", str(tmp_path / "answer.json"))
    answer = json.loads((tmp_path / "answer.json").read_text()) if (tmp_path / "answer.json").exists() else None
    assert done.returncode in (0, 1), done.stdout + done.stderr
    if done.returncode == 0:
        assert answer["first_bad"]["sha"] == shas[SLOW_AT - 1], done.stdout
        assert len(answer["steps"]) <= math.ceil(math.log2(len(shas) - 1)) + 1
        assert "paired A/B" in done.stdout.splitlines()[0]
        assert "REGRESSION net-baseline step_time_ms" in done.stdout  # the A/B across it, explained
        # its cause: the slowed forward's extra matrix products (exact; the op times' rows depend on the machine's noise)
        assert "FLOPs by op: aten.mm" in done.stdout
    else:
        assert done.stdout.splitlines()[-1].startswith("trainbench bisect: FAILED to find the commit: ")
        assert answer is None or shas[SLOW_AT - 1] in answer["open"]


def test_a_commit_whose_environment_does_not_build_is_skipped_with_its_reason(tmp_path):
    from trainbench.jobs.bisect_runs import Unbuildable, environment

    assert environment(tmp_path, None) == sys.executable  # this Python, the commit's code first on sys.path
    assert environment(tmp_path, f"echo building; echo {sys.executable}") == sys.executable
    with pytest.raises(Unbuildable, match=r"^the build command exited 3: no wheel for torch==9$"):
        environment(tmp_path, "echo no wheel for torch==9 >&2; exit 3")
    with pytest.raises(Unbuildable, match=r"last line \['built'\] is not a Python executable"):
        environment(tmp_path, "echo built")
