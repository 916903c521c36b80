"""One line for a failure in a summary, whichever part of a case it came from (torch-free: torch's frames are
recognised by its folder, if it is loaded)."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path


def failure_line(error: BaseException, limit: int = 300) -> str:
    """One line for a summary: the exception's type, its message's first line, and the last frame outside torch
    (the model's, the spec's or trainbench's code that called the op), e.g. ``TypeError: Multiple dispatch failed
    for 'torch._ops.aten.stack.default'; all __torch_dispatch__ handlers returned NotImplemented: (at
    trainbench/predict.py:146)``."""
    torch = sys.modules.get("torch")  # not loaded: no frame of it can be in the traceback
    torch_dir = str(Path(torch.__file__).parent) if torch is not None and getattr(torch, "__file__", None) else None
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if torch_dir is None or not f.filename.startswith(torch_dir)]
    where = f" (at {'/'.join(Path(frames[-1].filename).parts[-3:])}:{frames[-1].lineno})" if frames else ""
    text = str(error).strip()
    message = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {message[:limit]}{where}"
