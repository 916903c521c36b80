"""What a trainbench case says besides passing or failing: a skip located at the user's test, and the warnings of
cases that ran with no budget or whose timing could not be judged."""

from __future__ import annotations

import warnings

import pytest


def skip(reason: str):
    """Skip the running test, the skip located at the user's test (``pytest -rs`` names it, not this module)."""
    raise pytest.skip.Exception(reason, _use_item_location=True)


class NoBudgetWarning(UserWarning):
    """Cases ran with no budget for this device: nothing was checked (one warning per test file, naming its cases)."""


class InconclusiveTimingWarning(UserWarning):
    """A timed budget whose rounds cannot show it kept or missed (noise, a busy machine), measured twice:
    reported, not failed (``--trainbench-strict-timing`` fails it)."""


class UnbudgetedCases:
    """The cases of one test file that ran with no budget, said in one ``NoBudgetWarning`` when the file's last test
    ends (``-W error::trainbench.plugin.NoBudgetWarning`` then fails that test's teardown)."""

    def __init__(self, path):
        self.path, self.line = str(path), 1  # where the warning points: the first such case's test
        self.reasons: dict[str, list[str]] = {}  # why no budget applies -> its cases, in the order they ran

    def add(self, case: str, reason: str | None, line: int) -> None:
        if not self.reasons:
            self.line = line
        cases = self.reasons.setdefault(reason or "no budget", [])
        if case not in cases:
            cases.append(case)

    def warn(self) -> None:
        if not self.reasons:
            return
        count = sum(len(cases) for cases in self.reasons.values())
        lines = [f"{', '.join(cases)}: {reason}" for reason, cases in self.reasons.items()]
        text = f"{count} case{'s' if count > 1 else ''} ran with no budget; nothing was checked:\n  " + "\n  ".join(lines)
        warnings.warn_explicit(NoBudgetWarning(text), NoBudgetWarning, self.path, self.line)
