"""The night's folder packed into one .tar.gz small enough to come back from a lent GPU box."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

from trainbench.core.harness.files import write_atomic

# What comes back from a lent GPU box: files of at most 16 MiB.
ARCHIVE_LIMIT_BYTES = 16 * 2**20
# Left out first where the archive would be larger: traces, then the ladder report's pictures, then logs.
ARCHIVE_LEAVE_FIRST = ("*trace*", "*.png", "logs/*")


def pack_folder(out: Path, archive: Path, limit: int = ARCHIVE_LIMIT_BYTES,
                leaving_out: Callable[[list[str]], None] = lambda left_out: None) -> list[str]:
    """The folder ``out`` as one .tar.gz at ``archive`` (written whole, never a partial file) of at most ``limit``
    bytes; where everything would not fit, files are left out in ``ARCHIVE_LEAVE_FIRST``'s order (the largest of
    each kind first), ``leaving_out`` told each time what is left out so far (before the folder is packed again: it
    may rewrite a file that says so). Returns what was left out."""
    left_out: list[str] = []
    while True:
        files = sorted(p for p in out.rglob("*") if p.is_file() and not p.name.endswith(".tmp"))  # summary.md too
        data = _tar_gz(out, [f for f in files if _relative(out, f) not in left_out])
        if len(data) <= limit:
            break
        candidates = [f for pattern in ARCHIVE_LEAVE_FIRST for f in sorted(
            (f for f in files if f.relative_to(out).match(pattern) and _relative(out, f) not in left_out),
            key=lambda f: -f.stat().st_size)]
        if not candidates:
            raise ValueError(f"{len(data) / 2**20:.1f} MiB without {', '.join(left_out) or 'anything'} left out: "
                             f"over the {limit / 2**20:.0f} MiB limit")
        left_out.append(_relative(out, candidates[0]))
        leaving_out(list(left_out))
    write_atomic(archive, lambda f: f.write(data))
    return left_out


def _relative(out: Path, path: Path) -> str:
    return path.relative_to(out).as_posix()


def _tar_gz(out: Path, files: list[Path]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in files:
            tar.add(path, arcname=f"{out.name}/{_relative(out, path)}")
    return buffer.getvalue()
