"""The checks a session makes before its first case that need more than the options: every file and folder it will
write takes a file now, and each budgets file it reads is loaded and checked once. Found after the whole run, an
unwritable folder or a broken budgets file lost what was measured."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from trainbench.core.harness.files import cannot_write
from trainbench.core.records.budgets import BudgetError, Budgets
from trainbench.plugin.options import shown, usage_error
from trainbench.verdicts.store import storage_folder


def check_writable(outputs: list[tuple[str, Path | None]]) -> None:
    """Every folder the session will write into takes a file now."""
    for option, folder in outputs:
        problem = folder is not None and cannot_write(folder)
        if problem:
            raise usage_error(f"{option}: cannot write into {shown(folder)} ({problem}); expected a writable folder")


def check_output_files(outputs: list[tuple[str, Path | None]]) -> None:
    """Every file the session writes at its end can be written now: its folder takes a file (created if
    missing) and the path is not a folder."""
    for option, path in outputs:
        if path is None or hasattr(path, "write"):  # pytest-benchmark < 5.3 opens --benchmark-json itself
            continue
        path = Path(path)
        if path.is_dir():  # output_file_problem's first answer, with an example of the path wanted
            raise usage_error(f"{option}={shown(path)}: is a folder; expected a file path (e.g. "
                              f"{shown(path / 'out.json')})")
        check_writable([(option, path.parent)])


def check_save_name(name: str | None, storage: str) -> None:
    """--benchmark-save's file name (``NNNN_<name>.json``) fits the storage folder's file system: a name too long
    failed only at the save, after the whole run."""
    if not name:
        return
    folder = storage_folder(storage)
    if folder is None:  # not a file storage
        return
    try:
        longest = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        longest = 255
    file_name = f"0000_{name}.json"
    if len(os.fsencode(file_name)) > longest:
        raise usage_error(f"--benchmark-save={name[:40]}...: the run's file name ({len(os.fsencode(file_name))} "
                          f"bytes) is longer than {folder} takes ({longest}); expected a shorter name")


@dataclass
class BudgetFiles:
    """The budgets files of the session's cases, each loaded once (a malformed one is a usage error)."""

    loaded: dict[Path | None, Budgets] = field(default_factory=dict)  # path (None: none configured) -> its budgets

    def __call__(self, path: Path | None) -> Budgets:
        if path not in self.loaded:
            try:
                self.loaded[path] = Budgets.load(path) if path is not None else Budgets.empty()
            except BudgetError as e:
                raise usage_error(str(e)) from None
        return self.loaded[path]

    def check_case_ids(self, paths: set, known: set[str]) -> None:
        """A budgets entry one typo away from a case id fails the session at start-up, not silently at the end."""
        for path in paths:
            try:
                self(path).check_case_ids(known)
            except BudgetError as e:
                raise usage_error(str(e)) from None
