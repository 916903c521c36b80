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
  killed or out of disk mid-save leaves a truncated newest run; trainbench's sessions replace it (same name from
  ``_next_num``, same bytes) with an atomic write.
"""

from __future__ import annotations

from pathlib import Path

from trainbench.core.files import write_text_atomic


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


def save_atomically(config) -> None:
    """pytest-benchmark's --benchmark-save/--benchmark-autosave write the run through a temporary file that is
    moved into place whole: never a 0-byte or partial run that the next --benchmark-compare would read."""
    storage = getattr(_session(config), "storage", None)
    if not hasattr(storage, "_next_num"):  # not its file storage (elasticsearch): left as it is
        return
    from pytest_benchmark.utils import safe_dumps

    def save(output_json, save):  # FileStorage.save's naming and serialization
        output_file = storage.get(f"{storage._next_num}_{save}.json")
        if output_file.exists():
            raise FileExistsError(f"{output_file}: a run of that number exists; not overwritten")
        write_text_atomic(output_file, safe_dumps(output_json, ensure_ascii=True, indent=4))
        storage.logger.info(f"Saved benchmark data in: {output_file}")

    storage.save = save


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
