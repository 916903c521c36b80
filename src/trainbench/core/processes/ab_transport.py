"""The transport of an A/B run (``trainbench.jobs.ab``): each side a worker process, one JSON line per command.

A side is ``python -m trainbench.core.processes.ab_worker`` started with that side's Python (so each imports its own torch),
spoken to over its stdin and stdout; its stderr is kept in a log whose tail explains a worker that ended.
What the commands mean, and in what order an A/B run sends them, is ``trainbench.jobs.ab``'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

import trainbench
from trainbench.core.processes.ab_worker import PROTOCOL

# A side answers within this many times the case's no-progress limit (--trainbench-timeout): while a command makes
# progress its worker says so (a ``{"progress": true}`` line) at least every quarter of the limit, and a command
# that makes none fails in the worker at the limit; a side silent for longer never answers (a wrapper that never
# execs, a stuck interpreter).
SILENCE_FACTOR = 2


class SideError(RuntimeError):
    """A side could not start, or failed a command: the message names the side and its Python."""


class _WorkerEnded(SideError):
    """The worker process ended during a command; the message ends with its stderr's tail."""


class Side:
    """One environment: ``python -m trainbench.core.processes.ab_worker`` under ``python``, one JSON line per command."""

    def __init__(self, label: str, python: str, env: dict[str, str] | None = None, limit_s: float | None = None):
        self.label, self.python = label, python
        self.limit_s = limit_s  # the no-progress limit (None or 0: wait for ever)
        self.greeted = False  # asked for hello
        self.announced: dict | None = None  # the protocol and trainbench version it said first to hello
        self.hello: dict | None = None  # its whole answer to hello
        # The worker's stderr, kept while the side lives (its tail explains a worker that ended).
        self.log = tempfile.NamedTemporaryFile(prefix=f"trainbench-ab-{label}-", suffix=".log", delete=False)  # noqa: SIM115
        try:
            self.process = subprocess.Popen([python, "-m", "trainbench.core.processes.ab_worker"], stdin=subprocess.PIPE,
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

    def _answer(self, command: str, announcement: bool = False) -> str:
        """The worker's next answer line, skipping its progress lines (``announcement``: but for one that says the
        worker's protocol); a side silent past the deadline is killed."""
        wait = self.limit_s * SILENCE_FACTOR if self.limit_s else None
        while True:
            try:
                line = self.lines.get(timeout=wait)
            except queue.Empty:
                self.close(force=True)
                raise SideError(f"{self.label} side ({self.python}): no answer to {command!r} for {wait:g} s "
                                f"({SILENCE_FACTOR}x the no-progress limit of {self.limit_s:g} s, "
                                "--trainbench-timeout); the side was stopped") from None
            if not line:
                return line
            try:
                answer = json.loads(line)
            except ValueError:
                answer = None
            if not isinstance(answer, dict):  # a wrapper or a library printing on the worker's stdout
                self.close(force=True)
                raise SideError(f"{self.label} side ({self.python}): answered {command!r} with {line.strip()[:80]!r}, "
                                "not a line of trainbench's A/B protocol (does a wrapper script print on stdout?); "
                                "the side was stopped") from None
            if not answer.get("progress") or (announcement and "protocol" in answer):
                return line

    def call(self, command: str, **arguments) -> dict:
        self._send(command, **arguments)
        return self._receive(command)

    def _send(self, command: str, **arguments) -> None:
        try:
            self.process.stdin.write(json.dumps({"command": command, **arguments}) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # the worker ended: its stdout says so

    def _receive(self, command: str, announcement: bool = False) -> dict:
        line = self._answer(command, announcement)
        if not line:
            raise _WorkerEnded(f"{self.label} side ({self.python}): the worker ended during {command!r}:\n"
                               f"{self._log_tail()}")
        answer = json.loads(line)
        if "error" in answer:
            raise SideError(f"{self.label} side ({self.python}): {command} failed:\n{answer['error']}")
        return answer

    def _log_tail(self) -> str:
        self.log.flush()
        return "\n".join(Path(self.log.name).read_text(errors="replace").splitlines()[-30:])

    def greet(self) -> None:
        """Ask for ``hello`` (once): the worker starts loading what it answers with while the other side is asked."""
        if not self.greeted:
            self.greeted = True
            self._send("hello")

    def announce(self) -> dict:
        """The protocol and trainbench version the side said first to ``hello``, checked: this trainbench's protocol. A
        worker says them before it loads torch, so a side refused for them is stopped at once; one that does not
        (an older trainbench) has answered hello whole. Anything else raises ``SideError`` in one line naming the
        side's Python and what is wrong (no trainbench there, another protocol)."""
        self.greet()
        if self.announced is None:
            first = self._handshaking(announcement=True)
            self.announced = {"protocol": first.get("protocol"), "trainbench": first.get("trainbench")}
            if not first.get("progress"):
                self.hello = first
            if self.announced["protocol"] != PROTOCOL:
                raise SideError(f"{self.label} side ({self.python}): its trainbench ({self.announced['trainbench']}) "
                                f"speaks A/B protocol {self.announced['protocol']}, this one ({trainbench.__version__}) "
                                f"speaks {PROTOCOL}; install the same trainbench in both environments")
        return self.announced

    def handshake(self) -> dict:
        """The side's whole ``hello`` (its identity and packages), from a worker of this trainbench's protocol
        (``announce``); a failure is one line, as there."""
        self.announce()
        if self.hello is None:
            self.hello = self._handshaking()
        return self.hello

    def _handshaking(self, announcement: bool = False) -> dict:
        """The side's next line to ``hello``; a worker that ended, an error, silence or a line of no protocol raise
        ``SideError`` in one line."""
        try:
            return self._receive("hello", announcement)
        except _WorkerEnded:
            raise SideError(self._why_it_ended()) from None
        except SideError as e:  # an error answered (its traceback's last line), silence, a line of no protocol
            first, *rest = str(e).splitlines()
            raise SideError(f"{first} {rest[-1].strip()}" if rest else first) from None

    def _why_it_ended(self) -> str:
        """Why a worker ended before answering ``hello``, in one line: the last line it wrote on stderr."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)  # its last words are in the log once it has exited
        lines = [line.strip() for line in self._log_tail().splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit status {self.process.returncode}, nothing on stderr"
        where = f"{self.label} side ({self.python})"
        if "No module named 'trainbench'" in last:
            return (f"{where}: cannot import trainbench: ModuleNotFoundError: No module named 'trainbench'; expected a "
                    "Python whose environment has trainbench installed")
        if "No module named 'trainbench." in last:
            return (f"{where}: its trainbench has no A/B worker (trainbench.core.processes.ab_worker): {last}; another "
                    f"trainbench version: install this one ({trainbench.__version__}) in both environments")
        return f"{where}: the worker ended before answering hello: {last}"

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
    """Both sides started and checked: this trainbench's protocol and the same trainbench version on both
    (``Side.announce``; a failure is one line), before either loads torch for its identity. Returns their
    identities. Each answer is waited for ``SILENCE_FACTOR`` times ``limit_s`` (the no-progress limit) at most."""
    sides = (Side("base", base_python, base_env, limit_s), Side("head", head_python, head_env, limit_s))
    try:
        for side in sides:
            side.greet()
        announced = {side.label: side.announce() for side in sides}
        versions = {label: (a["protocol"], a["trainbench"]) for label, a in announced.items()}
        if versions["base"] != versions["head"]:
            raise SideError(f"trainbench differs between the sides: base {base_python} has {versions['base'][1]} "
                            f"(protocol {versions['base'][0]}), head {head_python} has {versions['head'][1]} "
                            f"(protocol {versions['head'][0]}); install the same trainbench in both")
        hello = {side.label: side.handshake() for side in sides}
    except BaseException:
        for side in sides:
            side.close(force=True)  # a side that failed its handshake is not waited for
        raise
    return sides[0], sides[1], hello
