"""Atomic file writes: a reader (or a crash) never sees half a report, verdict or budgets file."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomic(path: Path, write: Callable[[BinaryIO], object], exclusive: bool = False) -> None:
    """``write(file)`` into a temporary file next to ``path``, flushed to disk, then moved into place: killed or out
    of space mid-write, ``path`` is either the old file or the whole new one. The temporary file's name starts
    with a dot and ends in ``.tmp``, so no glob of runs or reports takes it. ``exclusive``: an existing ``path``
    is never replaced (FileExistsError)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if hasattr(os, "fchmod"):  # as open() would create it (mkstemp's is private to its owner)
            os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the name points at it
        if exclusive:
            _link(tmp, path)
        else:
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _link(tmp: str, path: Path) -> None:
    """Put ``tmp`` at ``path`` unless something is there: a hard link fails on an existing name, where a rename
    would replace it (a file system without hard links: checked, then renamed)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, "exists; not overwritten", str(path)) from None
    except OSError:
        if path.exists():
            raise FileExistsError(errno.EEXIST, "exists; not overwritten", str(path)) from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0o022)  # read by setting it: the only portable way
    os.umask(mask)
    return mask


def write_text_atomic(path: Path, text: str, exclusive: bool = False) -> None:
    write_atomic(path, lambda f: f.write(text.encode("utf-8")), exclusive)


def write_json_atomic(path: Path, data) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def cannot_write(folder: Path) -> str | None:
    """Why nothing can be written into ``folder`` (created if missing), or None: checked by writing, since
    permission bits do not tell (root ignores them; a read-only mount or a file in the way does not)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as e:
        return e.strerror or str(e)
    except ValueError as e:  # a NUL in the path: no file system takes it
        return str(e)


def output_file_problem(path: Path) -> str | None:
    """Why a file cannot be written at ``path`` at the end of a command, checked before its work, or None: a folder
    there, or a folder for it that cannot take a file (created if missing)."""
    path = Path(path)
    if path.is_dir():
        return "is a folder; expected a file path"
    problem = cannot_write(path.parent)
    return f"cannot write into {path.parent} ({problem})" if problem else None
