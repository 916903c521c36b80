"""The night's manifest (``night.json``): every step, its status and time, rewritten after each step."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainbench.core.harness.files import write_json_atomic


@dataclass
class StepRecord:
    name: str
    why: str
    status: str = "pending"  # pending, running, ok, failed, stopped (its deadline), not started, skipped
    exit_code: int | None = None
    seconds: float | None = None
    log: str | None = None
    note: str | None = None


@dataclass
class Night:
    """The night's manifest (``night.json``): every step, its status and time."""

    out: Path
    budget_s: float
    simulate_gpu: str | None
    python: str
    started: float = 0.0  # the clock's reading at the start
    steps: list[StepRecord] = field(default_factory=list)
    finished: bool = False
    interrupted: bool = False
    device: str = "cuda"  # cuda: a GPU night; cpu: the same night on the CPU cases
    profile: dict | None = None  # WindowProfile.to_json of the measuring steps
    deselected: dict[str, str] = field(default_factory=dict)  # case -> why the night did not run it
    verdict: str | None = None  # the last line's verdict, once the night has one
    archive_left_out: list[str] = field(default_factory=list)  # files the archive had no room for
    after: str | None = None  # --after: the earlier night's run whose measured cases go last tonight
    measured_before: frozenset[str] = frozenset()  # the case ids that run measured

    def to_json(self) -> dict:
        return {"budget_s": self.budget_s, "simulate_gpu": self.simulate_gpu, "python": self.python,
                "device": self.device, "profile": self.profile, "deselected": self.deselected,
                "after": self.after, "measured_before": sorted(self.measured_before),
                "finished": self.finished, "interrupted": self.interrupted, "verdict": self.verdict,
                "archive_left_out": self.archive_left_out,
                "steps": [asdict(step) for step in self.steps]}

    def save(self) -> None:
        write_json_atomic(self.out / "night.json", self.to_json())


class NightError(ValueError):
    """A night that cannot start, or a folder that holds no night to summarize; the message names what is wrong."""


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_manifest(out: Path) -> Night:
    """The night ``out``'s night.json recorded (``NightError`` where it holds none)."""
    manifest = _read_json(out / "night.json")
    if manifest is None or not isinstance(manifest.get("steps"), list):
        raise NightError(f"{out / 'night.json'}: missing or unreadable; expected a night's folder")
    try:
        night = Night(out, float(manifest["budget_s"]), manifest.get("simulate_gpu"), str(manifest.get("python")),
                      steps=[StepRecord(**step) for step in manifest["steps"]], finished=bool(manifest["finished"]),
                      interrupted=bool(manifest.get("interrupted")), device=manifest.get("device", "cuda"),
                      profile=manifest.get("profile"), deselected=dict(manifest.get("deselected") or {}),
                      verdict=manifest.get("verdict"), archive_left_out=list(manifest.get("archive_left_out") or []),
                      after=manifest.get("after"), measured_before=frozenset(manifest.get("measured_before") or ()))
    except (KeyError, TypeError, ValueError) as e:
        raise NightError(f"{out / 'night.json'}: not a night's manifest ({e})") from None
    return night
