"""The transport of an A/B run (``trainbench.verdicts.ab``): each side a worker process, one JSON line per command.

A side is ``python -m trainbench.verdicts.ab_worker`` started with that side's Python (so each imports its own torch),
spoken to over its stdin and stdout; its stderr is kept in a log whose tail explains a worker that ended.
What the commands mean, and in what order an A/B run sends them, is ``trainbench.verdicts.ab``'s.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

# A side answers within this many times the case's no-progress limit (--trainbench-timeout): while a command makes
# progress its worker says so (a ``{"progress": true}`` line) at least every quarter of the limit, and a command
# that makes none fails in the worker at the limit; a side silent for longer never answers (a wrapper that never
# execs, a stuck interpreter).
SILENCE_FACTOR = 2


class SideError(RuntimeError):
    """A side could not start, or failed a command: the message names the side and its Python."""


class Side:
    """One environment: ``python -m trainbench.verdicts.ab_worker`` under ``python``, one JSON line per command."""

    def __init__(self, label: str, python: str, env: dict[str, str] | None = None, limit_s: float | None = None):
        self.label, self.python = label, python
        self.limit_s = limit_s  # the no-progress limit (None or 0: wait for ever)
        # The worker's stderr, kept while the side lives (its tail explains a worker that ended).
        self.log = tempfile.NamedTemporaryFile(prefix=f"trainbench-ab-{label}-", suffix=".log", delete=False)  # noqa: SIM115
        try:
            self.process = subprocess.Popen([python, "-m", "trainbench.verdicts.ab_worker"], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=self.log, text=True,
                                            env={**os.environ, **(env or {})}, start_new_session=True)
        except OSError as e:
            raise SideError(f"{label} side ({python}): cannot start it: {e}") from None
        # Read on a thread, so that waiting for an answer can have a deadline; "" once the worker's stdout closes.
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name=f"trainbench-ab-{label}").start()

    def _read(self) -> None:
        try:
            for line in self.process.stdout:
                self.lines.put(line)
        except (OSError, ValueError):
            pass
        self.lines.put("")

    def _answer(self, command: str) -> str:
        """The worker's next answer line, skipping its progress lines; a side silent past the deadline is killed."""
        wait = self.limit_s * SILENCE_FACTOR if self.limit_s else None
        while True:
            try:
                line = self.lines.get(timeout=wait)
            except queue.Empty:
                self.close(force=True)
                raise SideError(f"{self.label} side ({self.python}): no answer to {command!r} for {wait:g} s "
                                f"({SILENCE_FACTOR}x the no-progress limit of {self.limit_s:g} s, "
                                "--trainbench-timeout); the side was stopped") from None
            if not line or not json.loads(line).get("progress"):
                return line

    def call(self, command: str, **arguments) -> dict:
        try:
            self.process.stdin.write(json.dumps({"command": command, **arguments}) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # the worker ended: its stdout says so
        line = self._answer(command)
        if not line:
            raise SideError(f"{self.label} side ({self.python}): the worker ended during {command!r}:\n{self._log_tail()}")
        answer = json.loads(line)
        if "error" in answer:
            raise SideError(f"{self.label} side ({self.python}): {command} failed:\n{answer['error']}")
        return answer

    def _log_tail(self) -> str:
        self.log.flush()
        return "\n".join(Path(self.log.name).read_text(errors="replace").splitlines()[-30:])

    def close(self, force: bool = False) -> None:
        """End the worker: asked to, or (``force``: an interrupted session) killed at once."""
        if self.log.closed:
            return
        try:
            if self.process.poll() is None and not force:
                self.process.stdin.write(json.dumps({"command": "close"}) + "\n")
                self.process.stdin.flush()
                self.process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)

    def __enter__(self) -> Side:  # noqa: PYI034 (typing.Self needs Python 3.11)
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def start(base_python: str, head_python: str, base_env: dict | None = None, head_env: dict | None = None,
          limit_s: float | None = None) -> tuple[Side, Side, dict]:
    """Both sides started and checked: the same protocol and trainbench version. Returns their identities. Each
    answer is waited for ``SILENCE_FACTOR`` times ``limit_s`` (the no-progress limit) at most."""
    sides = (Side("base", base_python, base_env, limit_s), Side("head", head_python, head_env, limit_s))
    try:
        hello = {side.label: side.call("hello") for side in sides}
        versions = {label: (h["protocol"], h["trainbench"]) for label, h in hello.items()}
        if versions["base"] != versions["head"]:
            raise SideError(f"trainbench differs between the sides: base {base_python} has {versions['base'][1]} "
                            f"(protocol {versions['base'][0]}), head {head_python} has {versions['head'][1]} "
                            f"(protocol {versions['head'][0]}); install the same trainbench in both")
    except BaseException:
        for side in sides:
            side.close(force=True)  # a side that failed its handshake is not waited for
        raise
    return sides[0], sides[1], hello
