"""Which commit made it slower or hungrier: a binary search over the commits between a good and a bad one.

The search knows nothing of how a commit is judged: ``Search`` takes each step's verdict (``good``, ``bad``, ``skip``
for a commit that cannot be built or measured, as ``git bisect skip``; ``undecided`` for a measurement that could
not tell, which stops it) and names the next commit to judge, the one nearest the middle of what is still open. The
steps are kept in a log (``BisectLog``, one JSON line a step, written as each ends), so an interrupted search
continues where it stood. ``trainbench.jobs.bisect_runs`` judges commits: one run each on an exact signal, a
paired A/B against the last good commit on a timed one.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

GOOD, BAD, SKIP, UNDECIDED = "good", "bad", "skip", "undecided"
VERDICTS = (GOOD, BAD, SKIP, UNDECIDED)


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:12]

    def line(self) -> str:
        return f"{self.short} {self.subject}"


@dataclass(frozen=True)
class Step:
    """One commit judged: its verdict, what was seen (the metric's change, or why it could not be judged), the commit
    it was compared with, and the wall seconds it took."""

    commit: str  # its sha
    verdict: str  # one of VERDICTS
    seen: str
    against: str | None = None
    seconds: float = 0.0
    details: tuple[str, ...] = ()  # the comparison's lines (the cause of a change), shown with the answer

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"a bisect step's verdict is one of {VERDICTS}, got {self.verdict!r}")

    def to_json(self) -> dict:
        return {**asdict(self), "details": list(self.details)}

    @classmethod
    def from_json(cls, data: dict) -> Step:
        return cls(data["commit"], data["verdict"], data["seen"], data.get("against"), float(data.get("seconds", 0)),
                   tuple(data.get("details", ())))


@dataclass(frozen=True)
class Answer:
    """Where the search stands: ``first_bad`` where it is found, else the commits it may still be (``open``) and why
    it stopped (``stopped``: a step that could not tell, or every open commit skipped)."""

    first_bad: Commit | None
    open: tuple[Commit, ...]
    last_good: Commit | None  # the newest commit judged good (None: only the given good one)
    stopped: str | None = None


class Search:
    """The first bad commit of ``commits`` (oldest first, after the good commit; the last is the bad one, known bad)."""

    def __init__(self, commits: list[Commit], steps: list[Step] | tuple[Step, ...] = ()):
        if not commits:
            raise ValueError("nothing to search: the bad commit is the good one")
        self.commits = list(commits)
        self.index = {c.sha: i for i, c in enumerate(self.commits)}
        self.steps: list[Step] = []
        for step in steps:
            self.record(step)

    def record(self, step: Step) -> None:
        if step.commit not in self.index:
            raise ValueError(f"{step.commit[:12]} is not between the good and the bad commit")
        self.steps.append(step)

    def _verdicts(self) -> dict[int, str]:
        return {self.index[s.commit]: s.verdict for s in self.steps}

    def _bounds(self) -> tuple[int, int]:
        """(newest good index or -1, oldest bad index): the first bad commit lies in (lo, hi]."""
        verdicts = self._verdicts()
        hi = min([i for i, v in verdicts.items() if v == BAD] + [len(self.commits) - 1])
        lo = max([i for i, v in verdicts.items() if v == GOOD and i < hi] + [-1])
        return lo, hi

    def next(self) -> Commit | None:
        """The commit to judge next (the open one nearest the middle), or None: found, or stopped (``answer``)."""
        if any(s.verdict == UNDECIDED for s in self.steps):
            return None
        lo, hi = self._bounds()
        verdicts = self._verdicts()
        candidates = [i for i in range(lo + 1, hi) if i not in verdicts]
        if not candidates:
            return None
        middle = (lo + hi) / 2
        return self.commits[min(candidates, key=lambda i: (abs(i - middle), i))]

    def answer(self) -> Answer:
        lo, hi = self._bounds()
        last_good = self.commits[lo] if lo >= 0 else None
        undecided = next((s for s in self.steps if s.verdict == UNDECIDED), None)
        open_commits = tuple(self.commits[lo + 1:hi + 1])
        if undecided is not None:
            return Answer(None, open_commits, last_good, f"{undecided.commit[:12]} could not be judged: {undecided.seen}")
        if len(open_commits) == 1:
            return Answer(open_commits[0], open_commits, last_good)
        if self.next() is None:  # every commit before the oldest bad one is skipped
            return Answer(None, open_commits, last_good, f"{len(open_commits) - 1} commits before "
                          f"{self.commits[hi].short} could not be built or measured")
        return Answer(None, open_commits, last_good, "not finished")

    def steps_needed(self) -> int:
        """Steps a search of this many commits takes without skips: ceil(log2(commits))."""
        return math.ceil(math.log2(len(self.commits))) if len(self.commits) > 1 else 0


class BisectLog:
    """The steps of one search, a JSON line each after a header naming the search (its inputs' digest in the file's
    name): a rerun of the same search reads them and continues. A line cut short by an interruption is left out."""

    def __init__(self, path: Path, header: dict):
        self.path = Path(path)
        self.header = header

    def read(self) -> tuple[list[Step], str | None]:
        """The steps logged so far, and a note where a line could not be read (the interrupted last one)."""
        if not self.path.exists():
            return [], None
        steps, note = [], None
        lines = self.path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines[1:], start=2):
            try:
                steps.append(Step.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                note = f"{self.path}:{number}: a step that was not written whole (interrupted?): judged again"
        return steps, note

    def append(self, step: Step) -> None:
        """Add ``step``, on disk before this returns (a crash after it keeps it)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        cut = not new and self.path.read_bytes()[-1:] != b"\n"  # a line an interruption cut: ended, not continued
        with open(self.path, "a", encoding="utf-8") as log:
            if new:
                log.write(json.dumps({"bisect": self.header}, sort_keys=True) + "\n")
            elif cut:
                log.write("\n")
            log.write(json.dumps(step.to_json(), sort_keys=True) + "\n")
            log.flush()
            os.fsync(log.fileno())
