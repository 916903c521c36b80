"""Memory predictions made before the first case, on every core the session may use.

A case's prediction (``trainbench.core.analyses.predict``) runs after its measurement, on one core, while the other idles:
FakeTensorMode's dispatch is Python, about a second a setup, and a suite asks for about a hundred setups, a minute
of a first run (later runs find them kept in pytest's cache). Before the first case nothing is timed, so the setups
that the collected cases will ask for are predicted then by forked processes, one a core, each taking the next setup
not yet taken; each predicts exactly as the case would (the same ``predict_memory``, the same keys), and the case
then finds its prediction made.

Forking shares the session's specs and configs as they are (a user's model builder need not pickle). It is done
only where it is safe: fake tensors on the CPU (a forked child cannot use a CUDA context its parent made), a
platform that forks, no other thread running (a lock one holds would stay held in the child forever), more than
one core. This process runs no step itself: autograd refuses to run in a process forked after its parent ran a
backward, so a child first checks that it can (a session whose own code ran one before gets no predictions ahead,
and says why). A child that dies, or sends nothing for ``no_progress_s``, loses only the setups it had not sent:
their cases predict them when they run, as without this module.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.connection import wait

import torch

from trainbench.core.analyses.predict import PredictionCache
from trainbench.core.method.measure import heap_frozen
from trainbench.core.setups.recipes import TrainConfig
from trainbench.core.setups.spec import TrainingSpec

Setup = tuple[str, TrainConfig, TrainingSpec]  # (profile name, config, spec): what ``PredictionCache`` is asked


@dataclass(frozen=True)
class PredictedAhead:
    """What the pass did: setups predicted, by how many processes in how many wall seconds, how many it left to the
    cases (a child that died or stalled), and why no process could predict (``refused``)."""

    setups: int
    processes: int
    seconds: float
    left: int = 0
    refused: str | None = None

    def line(self) -> str:
        if not self.processes:
            return f"memory predictions: made by each case, none ahead: {self.refused}"
        left = f"; {self.left} left to their cases (a process ended early)" if self.left else ""
        return (f"memory predictions: {self.setups} setups made before the first case in {self.seconds:.1f} s by "
                f"{self.processes} processes{left}")


def why_not_forked(cache: PredictionCache, processes: int) -> str | None:
    """Why the predictions cannot be made in forked processes here, or None."""
    if processes < 2:
        return "one core"
    if "fork" not in multiprocessing.get_all_start_methods():
        return "this platform does not fork"
    if not cache.backend.usable_after_fork:
        return f"fake tensors on {cache.backend.device}: a forked process cannot use its parent's device"
    threads = other_threads()
    if threads:
        return f"{threads} other threads running: a lock one holds would stay held in a forked process"
    return None


def other_threads() -> int:
    """Threads of this process besides the calling one (Python's; those a library starts in C are not seen)."""
    return threading.active_count() - 1


def predict_ahead(cache: PredictionCache, setups: Iterable[Setup], processes: int,
                  no_progress_s: float) -> PredictedAhead | None:
    """Predict every one of ``setups`` that ``cache`` does not know yet in ``processes`` forked processes; None where
    there is nothing to gain (fewer than two setups unknown) or forking is unsafe (``why_not_forked``)."""
    todo: dict[tuple, Setup] = {}
    for setup in setups:
        key = cache.key(*setup)
        if key not in todo and cache.known(key) is None:
            todo[key] = setup
    processes = min(processes, len(todo))
    if len(todo) < 2 or why_not_forked(cache, processes):
        return None
    started = time.perf_counter()
    keys, work = list(todo), list(todo.values())
    context = multiprocessing.get_context("fork")
    taken = context.Value("i", 0)
    children, pipes = [], []
    for _ in range(processes):
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(target=_predict_taken, args=(cache, work, taken, sender), daemon=True,
                                name="trainbench-predict")
        child.start()
        sender.close()
        children.append(child)
        pipes.append(receiver)
    made, refused = _collect(pipes, keys, no_progress_s)
    for child in children:
        child.join(timeout=0 if pipes else 5)
        if child.is_alive():  # stalled: what it had not sent is left to the cases
            child.kill()
            child.join()
    cache.store(made)
    return PredictedAhead(len(made), processes - len(refused), time.perf_counter() - started, len(work) - len(made),
                          refused[0] if refused else None)


def _collect(pipes: list, keys: list[tuple], no_progress_s: float) -> tuple[dict[tuple, dict], list[str]]:
    """What the children send, until each is done or has sent nothing for ``no_progress_s`` (the others go on): the
    predictions by key, and the reasons of the children that could not predict. ``pipes`` keeps those left open
    (their children stalled)."""
    made, refused = {}, []
    heard = dict.fromkeys(pipes, time.monotonic())  # when each child last sent something
    while heard:
        for pipe in wait(list(heard), timeout=min(1.0, no_progress_s)):
            try:
                index, prediction = pipe.recv()
            except (EOFError, OSError):
                del heard[pipe]
                pipes.remove(pipe)
                continue
            heard[pipe] = time.monotonic()
            if index is None:
                refused.append(prediction)
            else:
                made[keys[index]] = prediction
        now = time.monotonic()
        heard = {pipe: at for pipe, at in heard.items() if now - at < no_progress_s}
    return made, refused


def _taken(taken, count: int):
    """The indices of the work this process takes, one at a time, until none is left."""
    while True:
        with taken.get_lock():
            index = taken.value
            taken.value += 1
        if index >= count:
            return
        yield index


def _predict(cache: PredictionCache, setup: Setup) -> dict:
    _, config, spec = setup
    with heap_frozen():  # fake tensors' dispatch makes many objects (as in the case's own predict phase)
        return cache.predicted(config, spec)


def autograd_refused() -> str | None:
    """Why autograd cannot run in this process (one forked after its parent ran a backward), or None."""
    try:
        torch.ones(1, requires_grad=True).sum().backward()
    except RuntimeError as e:
        return f"a forked process cannot run autograd after this one ran a backward ({str(e).splitlines()[0]})"
    return None


def _predict_taken(cache: PredictionCache, work: list[Setup], taken, sender) -> None:
    """A forked child: predict what it takes and send (index, prediction) home; (None, why) where it cannot."""
    for interrupt in (signal.SIGINT, signal.SIGTERM):  # the session's handlers are its own: a child just ends
        signal.signal(interrupt, signal.SIG_DFL)
    torch.set_num_threads(1)  # no kernel runs under fake tensors; a forked OpenMP pool must not be entered
    refused = autograd_refused()
    if refused:
        sender.send((None, refused))
    else:
        for index in _taken(taken, len(work)):
            sender.send((index, _predict(cache, work[index])))
    sender.close()
