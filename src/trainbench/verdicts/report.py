"""The ladder report: a saved pytest-benchmark run's ladder rungs next to the seed articles' figures, as tables
and plots (``python -m trainbench report``); the session's own table is ``trainbench.verdicts.present.summary_table``.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trainbench.core.harness.files import write_atomic, write_text_atomic
from trainbench.core.records.result import CaseRecord, RecordError
from trainbench.devices.caps import DeviceCaps
from trainbench.verdicts.render import Column, Table, number
from trainbench.verdicts.store import RunFileError, SavedRun

if TYPE_CHECKING:  # the ladders import torch: load them only where a report is made
    from trainbench.core.setups.ladders import Ladder, LadderStep


# -- the ladder report: a saved pytest-benchmark run next to the seed articles' figures ----------

DEFAULT_REPORT_DIR = Path("results/report")


class ReportError(RunFileError):
    """A run file that cannot be reported on; ``str()`` names the file and what was expected."""


@dataclass(frozen=True)
class RungResult:
    """One rung of a ladder: what the article printed and what this run measured (None: not run)."""

    index: int
    step: LadderStep
    measured: CaseRecord | None  # the rung's stored record
    not_run_reason: str = ""

    def value(self, metric: str) -> float | None:
        """A metric of ``trainbench.core.records.metrics.METRICS``, or ``speedup_vs_baseline`` / ``batch_size``."""
        if self.measured is None:
            return None
        if metric == "speedup_vs_baseline":
            return self.measured.speedup_vs_baseline
        if metric == "batch_size":
            return self.measured.samples_per_step
        return self.measured.metrics.get(metric)


@dataclass(frozen=True)
class LadderRun:
    """A ladder's rungs (all of them, from ``trainbench.core.setups.ladders``) with this run's measurements."""

    ladder: Ladder
    rungs: list[RungResult]

    def relative(self, index: int) -> float | None:
        """This machine's samples/s at rung ``index`` relative to its rung 0.

        The plugin's speed-up against rung 0 where it measured one: timed in rounds
        interleaved with rung 0's, it is free of the drift between two cases measured
        minutes apart. Otherwise the ratio of the two cases' samples/s.
        """
        if index == 0:
            return 1.0 if self.rungs[0].value("samples_per_s") is not None else None
        paired = self.rungs[index].value("speedup_vs_baseline")
        return paired if paired is not None else _ratio(self.rungs[index].value("samples_per_s"),
                                                        self.rungs[0].value("samples_per_s"))

    def article_relative(self, index: int) -> float | None:
        return _ratio(self.rungs[index].step.article.samples_per_s, self.rungs[0].step.article.samples_per_s)

    def left_out_steps(self) -> list[str]:
        """Steps the run's rungs climbed without (each rung records them)."""
        for rung in reversed(self.rungs):
            left_out = ((rung.measured.ladder if rung.measured else None) or {}).get("left_out")
            if isinstance(left_out, list) and left_out:
                return [str(step) for step in left_out]
        return []


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


# -- reading a run ---------------------------------------------------------------------------------

def _not_run_reason(step, device: dict, profile_name: str | None, complete: bool = True) -> str:
    """Why a rung is absent from the run, as far as the step's requirements, the recorded device and whether the run
    finished tell: a rung of a run stopped before its end was not reached, whatever else may hold for it."""
    from trainbench.core.setups import eligibility, workloads  # lazy: the setups import torch, a report needs none

    caps = DeviceCaps.from_identity(device)
    profile = workloads.PROFILES.get(profile_name or caps.profile_name, workloads.PROFILES[caps.profile_name])
    device_reason = eligibility.why_not(step.recipe, caps, profile, context=eligibility.Context(slow_allowed=True))
    if device_reason:
        return device_reason.removeprefix(f"{step.recipe.name}: ")
    if not complete:
        return NOT_REACHED
    reason = eligibility.why_not(step.recipe, caps, profile, context=eligibility.Context(slow_allowed=False))
    return reason.removeprefix(f"{step.recipe.name}: ") if reason else ""


NOT_REACHED = "not reached: the run was stopped before it"


def ladder_runs(run: SavedRun) -> list[LadderRun]:
    """Every ladder with at least one rung in ``run``, in ``LADDERS`` order, each with all its rungs."""
    from trainbench.core.setups.ladders import LADDERS  # lazy: it imports torch, as the recipes do

    measured: dict[str, dict[int, CaseRecord]] = {}
    try:
        records = run.cases(having="ladder")
    except RecordError as e:
        raise ReportError(run.path, str(e).removeprefix(f"{run.path}: ")) from None
    for record in records:
        rung = record.ladder or {}
        if rung.get("name") not in LADDERS:
            continue
        index = rung.get("rung")
        if isinstance(index, int) and 0 <= index < len(LADDERS[rung["name"]].steps):
            measured.setdefault(rung["name"], {})[index] = record
    if not measured:
        raise ReportError(run.path, f"no ladder cases in the run; expected cases recorded with a 'ladder' rung "
                                    f"for one of {sorted(LADDERS)} (run benchmarks/test_recipes.py::test_ladder)")
    device, profile = run.device or {}, run.profile
    return [
        LadderRun(ladder, [RungResult(i, step, measured[name].get(i),
                                      "" if i in measured[name] else
                                      _not_run_reason(step, device, profile, run.complete))
                           for i, step in enumerate(ladder.steps)])
        for name, ladder in LADDERS.items() if name in measured
    ]


# -- describing the device -------------------------------------------------------------------------

def device_slug(device: dict, max_len: int = 48) -> str:
    """A short, filesystem-safe folder name from the device kind and name, e.g. ``cpu-amd-epyc-7763-64-core``."""
    name = str(device.get("name") or "unknown")
    # Trademark marks and filler words make long names without telling devices apart.
    name = re.sub(r"\((r|tm)\)|\bprocessor\b|\bcpu\b|@.*$", " ", name, flags=re.IGNORECASE)
    slug = re.sub(r"[^a-z0-9]+", "-", f"{device.get('kind') or 'device'} {name}".lower()).strip("-")
    return slug[:max_len].rstrip("-") or "device"


def device_caption(device: dict) -> str:
    """Device name, kind, threads or GPU details and the software versions, on one line."""
    kind = device.get("kind") or "unknown"
    details = [kind]
    on_gpu = DeviceCaps.from_identity(device).cuda
    if on_gpu:
        if device.get("capability"):
            details.append("sm " + ".".join(map(str, device["capability"])))
        if device.get("gpu_count"):
            details.append(f"{device['gpu_count']} GPU{'s' if device['gpu_count'] != 1 else ''}")
        if device.get("driver"):
            details.append(f"driver {device['driver']}")
    if on_gpu and device.get("cpu_model"):
        details.append(f"host {device['cpu_model']}")
    if device.get("cpu_threads"):
        details.append(f"{device['cpu_threads']} CPU threads")
    if device.get("cpu_capability"):
        details.append(device["cpu_capability"])
    software = f"torch {device.get('torch') or '?'}"
    if device.get("cuda"):
        software += f", CUDA {device['cuda']}"
    if device.get("cudnn"):
        software += f", cuDNN {device['cudnn']}"
    return f"{device.get('name') or 'unknown device'} ({', '.join(details)}); {software}"


def _run_caption(run: SavedRun) -> str:
    commit = run.commit
    commit_id = str(commit.get("id") or "")[:12] or "unknown"
    if commit.get("dirty"):
        commit_id += " (uncommitted changes)"
    return (f"Device: {device_caption(run.device or {})}. Profile: {run.profile or 'unknown'}. "
            f"Run: {run.saved_at or 'unknown time'}, commit {commit_id}.")


# -- markdown --------------------------------------------------------------------------------------

_LADDER_COLUMNS = (Column("Optimization", left=True), *(Column(title) for title in (
    "Batch", "Peak memory (MiB)", "Step time ms (median ± IQR)", "Samples/s", "Rel. to base", "Predicted GPU batch",
    "Predicted GPU tensor peak GB", "Article batch", "Article memory GB", "Article step ms", "Article samples/s",
    "Article rel. to base")), Column("Article note", left=True))


def ladder_table(lr: LadderRun) -> list[str]:
    """Markdown table: every rung, this machine's figures and the article's side by side."""
    return Table(_LADDER_COLUMNS, tuple(_ladder_row(lr, rung) for rung in lr.rungs)).markdown()


def _ladder_row(lr: LadderRun, rung: RungResult) -> tuple[str, ...]:
    art = rung.step.article
    article = [number(art.batch_size, "d"), number(art.memory_gb, ".2f"), number(art.step_time_ms, ".1f"),
               number(art.samples_per_s, "g"), number(lr.article_relative(rung.index), ".2f", "x"), art.note]
    predicted = (rung.measured.raw.get("predicted_memory") or {}) if rung.measured is not None else {}
    peak = (predicted.get("breakdown_bytes") or {}).get("total")
    gpu = [number(predicted.get("batch_size"), "d"),
           number(peak / 1e9 if peak else None, ".2f") if peak or not predicted.get("reason") else "not predicted"]
    if rung.measured is None:
        why = (rung.not_run_reason if rung.not_run_reason == NOT_REACHED else
               "not run on this device" + (f" ({rung.not_run_reason})" if rung.not_run_reason else ""))
        mine = [why, "", "", "", ""]
    else:
        step_ms, iqr_ms = rung.value("step_time_ms"), rung.value("step_time_iqr_ms")
        step = number(step_ms, ".1f") + ("" if step_ms is None or iqr_ms is None else f" ± {iqr_ms:.1f}")
        mine = [number(rung.value("batch_size"), "d"), number(rung.value("peak_memory_mib"), ".1f"), step,
                number(rung.value("samples_per_s"), ".1f"), number(lr.relative(rung.index), ".2f", "x")]
    return (f"{rung.index}. {rung.step.label}", *mine, *gpu, *article)


def ladder_summary(lr: LadderRun) -> str:
    """This machine from rung 0 to its highest measured rung, next to the article's own summary."""
    measured = [r for r in lr.rungs if r.value("samples_per_s") is not None]
    base = lr.rungs[0]
    if base.value("samples_per_s") is None:
        mine = f"rung 0 ({base.step.label}) not measured, nothing to compare against"
    elif len(measured) < 2:
        mine = f"only rung 0 measured, {base.value('samples_per_s'):.1f} samples/s"
    else:
        top = measured[-1]
        ratio = lr.relative(top.index)
        mine = (f"{base.step.label} → {top.step.label}: {ratio:.2f}x / {(ratio - 1) * 100:+.0f}% "
                f"({base.value('samples_per_s'):.1f} and {top.value('samples_per_s'):.1f} samples/s)")
    return f"**This machine:** {mine}. **Article:** {lr.ladder.article_summary}."


def ladder_markdown(run: SavedRun, ladders: list[LadderRun], plot_names: dict[str, str]) -> str:
    """The whole ``ladders.md``: run caption, then per ladder its table, summary and plot link."""
    method = ("Rel. to base is each rung's speed-up over rung 0 timed in interleaved rounds (both alive, "
              "alternating), so slow spells of a shared machine fall on both sides; the samples/s column is each "
              "rung's own rounds and the ratio of two such columns can differ from it. The predicted GPU columns are "
              "the rung at the GPU profile (224 px, the articles' batches) under FakeTensorMode: the tensor peak only, "
              "below what a GPU reports by the caching allocator's cache, cuDNN/cuBLAS workspaces and the CUDA context "
              "(an empty CUDA context alone is ~0.3-0.5 GB); the articles do not say which figure they print. "
              "Predicted on a CPU runner, backward saves what CPU kernels save.")
    out = ["# Optimization ladders on this device", "", _run_caption(run), "", method, ""]
    for lr in ladders:
        ladder = lr.ladder
        out += [f"## {ladder.name}: {ladder.title}", "", f"Source: {ladder.source}.", ""]
        out += ladder_table(lr) + [""]
        left_out = lr.left_out_steps()
        if left_out:
            out += [f"Later rungs climbed without: {', '.join(left_out)} (not runnable on this device).", ""]
        out += [ladder_summary(lr), ""]
        if ladder.name in plot_names:
            out += [f"![{ladder.name}: samples/s relative to rung 0 and per rung]({plot_names[ladder.name]})", ""]
    return "\n".join(out)


# -- plots -----------------------------------------------------------------------------------------

# White behind "not run" marks so the rung-0 reference line does not strike them through.
_LABEL_BOX = {"facecolor": "white", "edgecolor": "none", "pad": 1.0}


def ladder_figure(lr: LadderRun, device: dict):
    """Two panels: (a) samples/s relative to rung 0, this machine vs the article; (b) samples/s and peak memory."""
    # The object-oriented API with an Agg canvas: no pyplot, no global backend switch. Lazy: matplotlib takes a
    # while to import and only a report with plots needs it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = len(lr.rungs)
    xs = list(range(n))
    labels = [f"{r.index}. " + "\n".join(textwrap.wrap(r.step.label, 14)) for r in lr.rungs]
    fig = Figure(figsize=(max(9.0, 1.45 * n + 2), 8.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax_rel, ax_abs = fig.subplots(2, 1, sharex=True)
    _relative_panel(ax_rel, lr, xs, device)
    _absolute_panel(ax_abs, lr, xs)
    ax_abs.set_xticks(xs, labels, fontsize=8)
    ax_rel.tick_params(axis="x", labelbottom=True, labelsize=8)  # the rung names under both panels

    title = "\n".join(textwrap.wrap(f"{lr.ladder.name}: {lr.ladder.title}", 110))
    fig.suptitle(f"{title}\n{device.get('name') or 'unknown device'} ({device.get('kind') or '?'}), "
                 f"torch {device.get('torch') or '?'}", fontsize=11)
    return fig


def _nan_for_none(values: list) -> list[float]:
    return [float("nan") if v is None else v for v in values]


def _relative_panel(ax, lr: LadderRun, xs: list[int], device: dict) -> None:
    """(a): this machine's speed-up over rung 0 beside the article's, each missing bar saying why."""
    mine = [lr.relative(i) for i in xs]
    article = [lr.article_relative(i) for i in xs]
    width = 0.38
    bars_mine = ax.bar([x - width / 2 for x in xs], _nan_for_none(mine), width,
                       label=f"this machine ({device.get('kind') or '?'})", color="tab:blue")
    bars_article = ax.bar([x + width / 2 for x in xs], _nan_for_none(article), width, label="article",
                          color="tab:orange")
    for bars, values in ((bars_mine, mine), (bars_article, article)):
        ax.bar_label(bars, labels=["" if v is None else f"{v:.2f}x" for v in values], fontsize=7, padding=2)
    # Say why a bar is missing instead of leaving a silent gap.
    for x, rung in zip(xs, lr.rungs):
        if rung.measured is None:
            ax.text(x - width / 2, 0.05, "not run", rotation=90, fontsize=7, color="tab:blue", ha="center",
                    va="bottom", transform=ax.get_xaxis_transform(), bbox=_LABEL_BOX)
        if article[x] is None:
            ax.text(x + width / 2, 0.05, "not printed", rotation=90, fontsize=7, color="tab:orange",
                    ha="center", va="bottom", transform=ax.get_xaxis_transform(), bbox=_LABEL_BOX)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_ylabel("samples/s relative to rung 0")
    ax.set_title("(a) speed-up over the ladder's first rung", fontsize=10, loc="left")
    ax.margins(y=0.15)
    ax.legend(loc="upper left", fontsize=8)


def _absolute_panel(ax, lr: LadderRun, xs: list[int]) -> None:
    """(b): this machine's samples/s as bars and peak memory as a line on a second axis."""
    throughput = [r.value("samples_per_s") for r in lr.rungs]
    memory = [r.value("peak_memory_mib") for r in lr.rungs]
    bars = ax.bar(xs, _nan_for_none(throughput), 0.6, color="tab:blue", label="samples/s")
    ax.bar_label(bars, labels=["" if v is None else f"{v:.1f}" for v in throughput], fontsize=7, padding=2)
    for x, rung in zip(xs, lr.rungs):
        if rung.measured is None:
            ax.text(x, 0.05, "not run", rotation=90, fontsize=7, color="tab:blue", ha="center", va="bottom",
                    transform=ax.get_xaxis_transform(), bbox=_LABEL_BOX)
    ax.set_ylabel("samples/s (this machine)")
    ax.margins(y=0.15)
    ax_mem = ax.twinx()
    ax_mem.plot(xs, _nan_for_none(memory), color="tab:red", marker="o", label="peak memory (MiB)")
    ax_mem.set_ylabel("peak memory (MiB)", color="tab:red")
    ax_mem.tick_params(axis="y", colors="tab:red")
    # Headroom above the line keeps it clear of the bar labels at the top.
    top_memory = max((v for v in memory if v is not None), default=None)
    ax_mem.set_ylim(0, top_memory * 1.6 if top_memory else 1.0)
    ax.set_title("(b) this machine: throughput (bars) and peak memory (line)", fontsize=10, loc="left")
    handles = [bars] + ax_mem.get_lines()
    ax.legend(handles, [h.get_label() for h in handles], loc="upper left", fontsize=8)


# -- writing ---------------------------------------------------------------------------------------

def write_ladder_report(run_path: Path | str, out_dir: Path | str | None = None) -> list[Path]:
    """Render ``ladders.md`` and one PNG per ladder from a saved run; returns the paths written.

    ``out_dir`` defaults to ``results/report/<device-slug>``.
    """
    run_path = Path(run_path)
    run = SavedRun.load(run_path)
    ladders = ladder_runs(run)
    device = run.device or {}
    out = Path(out_dir) if out_dir is not None else DEFAULT_REPORT_DIR / device_slug(device)
    try:
        out.mkdir(parents=True, exist_ok=True)
        written = []
        plot_names = {}
        for lr in ladders:
            png = out / f"{lr.ladder.name}.png"
            fig = ladder_figure(lr, device)
            write_atomic(png, lambda f, fig=fig: fig.savefig(f, format="png", dpi=110))
            plot_names[lr.ladder.name] = png.name
            written.append(png)
        markdown = out / "ladders.md"
        text = ladder_markdown(run, ladders, plot_names)
        write_text_atomic(markdown, text)
    except OSError as e:
        raise ReportError(out, f"cannot write the report ({e.strerror or e})") from None
    return [markdown] + written
