"""The one place trainbench uses pytest-benchmark beyond its public hooks and storage.

Each private it touches is named here with the reason; a pytest-benchmark release that changes one of
them breaks this module alone (tests/test_architecture.py keeps the others off these names).

- ``config._benchmarksession`` (``BenchmarkSession``): its ``compare`` (the value of --benchmark-compare) and
  ``compared_mapping`` (the runs it loaded) say whether a baseline was loaded; pytest-benchmark only warns
  when it could not, and the gate must not pass unchecked.
- ``config.option.benchmark_compare``: rewritten before pytest-benchmark loads the baseline, so that it loads
  the run ``trainbench.verdicts.store.choose_baseline`` chose (runs of every device share its storage folder).
- ``BenchmarkFixture._timer``: replaced by a clock that replays the synchronized rounds trainbench timed, so
  pytest-benchmark's table, saved JSON and --benchmark-compare show exactly those rounds.
- ``BenchmarkFixture._mode``: set for a case that ended before it was timed, so pytest-benchmark does not
  report "fixture not used" for it.
- ``FileStorage.save`` and ``FileStorage._next_num``: ``save`` writes a run with a plain ``open()``, so a session
  killed or out of disk mid-save leaves a truncated newest run, and two sessions saving at once both take the
  number ``_next_num`` answers (one overwriting the other); trainbench's sessions replace it with an atomic write
  under a number taken exclusively, and a failed save is reported, not raised past the summary.
- ``FileStorage.location``: ``str(path.relative_to(cwd))``, a ValueError for a storage outside the working folder,
  which pytest-benchmark's own machine-info warning (a baseline from another host) raised as an INTERNALERROR.
- ``BenchmarkSession.benchmarks``, ``save``/``autosave``, ``get_machine_info``: with no benchmark pytest-benchmark
  saves nothing ("Not saving anything"); a trainbench run whose every case failed is saved anyway, with why.
- ``BenchmarkSession.benchmarks`` and ``get_machine_info`` again for ``--trainbench-save-progress``: pytest-benchmark
  writes its run only at the session's end, and a session killed before it lost every case it had measured.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from pytest_benchmark import utils as benchmark_utils  # by module: ``safe_dumps`` is looked up at each save

from trainbench.core.harness.files import write_text_atomic


def _session(config):
    return getattr(config, "_benchmarksession", None)


def compare_requested(config):
    """The --benchmark-compare value pytest-benchmark is working with (None: no comparison)."""
    session = _session(config)
    return session.compare if session is not None else None


def loaded_baseline(config) -> tuple[str, dict] | None:
    """The run pytest-benchmark loaded to compare with, as (path, {fullname: bench}), or None."""
    session = _session(config)
    if session is None or not session.compare or not session.compared_mapping:
        return None
    path, baseline = list(session.compared_mapping.items())[-1]
    return str(path), baseline


def compare_with(config, path: Path) -> None:
    """Make pytest-benchmark load ``path`` as the run to compare with (before its own configure reads it)."""
    config.option.benchmark_compare = str(path)


def save_atomically(config, report: Callable[[Path | None, str | None], None],
                    shielded: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> None:
    """pytest-benchmark's --benchmark-save/--benchmark-autosave write the run through a temporary file that is
    moved into place whole, under a run number no other session takes (``take_number``): never a 0-byte or
    partial run that the next --benchmark-compare would read, never one run over another. ``report(path, error)``
    is called once: the run saved (error None), or why it was not (the summary is still printed); the save runs
    inside ``shielded()`` (the session's SIGTERM waits for it)."""
    storage = getattr(_session(config), "storage", None)
    if not hasattr(storage, "_next_num"):  # not its file storage (elasticsearch): left as it is
        return
    def save(output_json, save):  # FileStorage.save's naming and serialization
        path = mark = None
        try:
            with shielded():
                text = benchmark_utils.safe_dumps(output_json, ensure_ascii=True, indent=4)
                number, mark = take_number(storage.get(""), next_number(storage))
                path = storage.get(f"{number}_{save}.json")
                write_text_atomic(path, text, exclusive=True)
        except (Exception, KeyboardInterrupt) as e:  # a full disk, a second SIGTERM: said after the summary
            report(path, f"{type(e).__name__}: {e}")
            return
        finally:
            if mark is not None:
                mark.unlink(missing_ok=True)
        storage.logger.info(f"Saved benchmark data in: {path}")
        report(path, None)

    storage.save = save


def next_number(storage) -> str:
    """The run number pytest-benchmark would give the next run (one more than the highest saved)."""
    return storage._next_num


def take_number(folder: Path, first: str) -> tuple[str, Path]:
    """The first run number from ``first`` on that no saved run has and no other session is saving under, and the
    mark that holds it until the run is in place (the caller removes it). The mark is created exclusively (open
    with 'x'), so two sessions never take one number, whatever their runs' names; a number a run has meanwhile
    taken is passed over. A mark left by a killed session only skips its number."""
    number = int(first)
    while True:
        mark = folder / f".{number:04}.saving"
        try:
            with open(mark, "x"):
                pass
        except FileExistsError:
            number += 1
            continue
        if any(folder.glob(f"{number:04}_*.json")):  # saved by a session that has let its mark go
            mark.unlink(missing_ok=True)
            number += 1
            continue
        return f"{number:04}", mark


def save_failed_cases(config) -> None:
    """--benchmark-save when no case has a result: pytest-benchmark saves nothing ("Not saving anything"), and the
    failed cases and why would be lost. Saves the run pytest-benchmark would have, with no benchmark (the session's
    ``pytest_benchmark_update_json`` adds the failed cases); its storage's ``save`` is the one above."""
    bs = _session(config)
    save = bs is not None and not bs.benchmarks and not bs.disabled and (bs.save or bs.autosave)
    if not save or not hasattr(bs.storage, "_next_num"):
        return
    machine_info = bs.get_machine_info()
    commit_info = config.hook.pytest_benchmark_generate_commit_info(config=config)
    config.hook.pytest_benchmark_update_commit_info(config=config, commit_info=commit_info)
    output_json = config.hook.pytest_benchmark_generate_json(config=config, benchmarks=[], include_data=bs.save_data,
                                                             machine_info=machine_info, commit_info=commit_info)
    config.hook.pytest_benchmark_update_json(config=config, benchmarks=[], output_json=output_json)
    bs.storage.save(output_json, save)


def locate_anywhere(benchmarksession) -> None:
    """pytest-benchmark names its storage relative to the working folder in its machine-info warning; a storage
    outside it (an absolute CI path) raised ValueError there. Its absolute path stands in."""
    storage = getattr(benchmarksession, "storage", None)
    cls = type(storage)
    if not isinstance(getattr(cls, "location", None), property) or getattr(cls, "_located_anywhere", False):
        return

    class LocatedAnywhere(cls):
        _located_anywhere = True

        @property
        def location(self):
            try:
                return cls.location.fget(self)
            except ValueError:
                return str(self.path)

    storage.__class__ = LocatedAnywhere


def mark_untimed(benchmark, why: str) -> None:
    """The case ended before it could be timed: say why instead of pytest-benchmark's "fixture not used" (a fixture
    that timed rounds keeps its mode)."""
    if not benchmark._mode:
        benchmark._mode = f"trainbench: {why}"


def replay_rounds(benchmark, round_step_times: list[float], steps_per_round: int) -> None:
    """Give pytest-benchmark the rounds trainbench timed: its timer reads back their start and end stamps."""
    if benchmark.disabled:
        benchmark.pedantic(lambda: None)
        return
    if not hasattr(benchmark, "_timer"):
        raise RuntimeError("unsupported pytest-benchmark version: BenchmarkFixture has no _timer")
    stamps, t = [], 0.0
    for per_step in round_step_times:
        stamps += [t, t + per_step * steps_per_round]
        t += per_step * steps_per_round
    clock = iter(stamps)
    benchmark._timer = lambda: next(clock)
    benchmark.pedantic(lambda: None, rounds=len(round_step_times), iterations=steps_per_round, warmup_rounds=0)


def write_progress(config, path: Path, marks: dict) -> bool:
    """The run so far, as ``--benchmark-json`` would write it at the session's end, written whole to ``path``
    with ``marks`` added (e.g. incomplete): ``BenchmarkSession.handle_saving``'s hooks over
    ``BenchmarkSession.benchmarks``, the machine and commit info read once and kept on the session. Returns
    whether anything was written (nothing before the first benchmark)."""
    bs = _session(config)
    if bs is None or not bs.benchmarks:
        return False
    infos = getattr(bs, "_trainbench_progress_infos", None)
    if infos is None:
        machine_info = bs.get_machine_info()
        commit_info = config.hook.pytest_benchmark_generate_commit_info(config=config)
        config.hook.pytest_benchmark_update_commit_info(config=config, commit_info=commit_info)
        infos = bs._trainbench_progress_infos = (machine_info, commit_info)
    output_json = config.hook.pytest_benchmark_generate_json(config=config, benchmarks=bs.benchmarks,
                                                             include_data=True, machine_info=infos[0],
                                                             commit_info=infos[1])
    config.hook.pytest_benchmark_update_json(config=config, benchmarks=bs.benchmarks, output_json=output_json)
    output_json.update(marks)
    write_text_atomic(path, benchmark_utils.safe_dumps(output_json, ensure_ascii=True, indent=4))
    return True
