"""Human-readable tables of measured cases."""

from __future__ import annotations


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary_table(rows: list[dict]) -> list[str]:
    """One line per case: throughput, step time, memory, work and the budget verdict."""
    header = ["case", "samples/s", "step ms (IQR)", "peak MiB", "act MiB", "GFLOP/sample", "vs base", "budget"]
    body = []
    for row in rows:
        m = row["metrics"]
        body.append([
            row["case"],
            _fmt(m["samples_per_s"], ".1f"),
            f"{_fmt(m['step_time_ms'], '.1f')} ({_fmt(m['step_time_iqr_ms'], '.1f')})",
            _fmt(m["peak_memory_mib"], ".1f"),
            _fmt(m["activation_mib"], ".1f"),
            _fmt(m["gflops_per_sample"], ".3f"),
            "-" if row.get("speedup") is None else f"{row['speedup']:.2f}x",
            row["budget"],
        ])
    widths = [max(len(r[i]) for r in [header] + body) for i in range(len(header))]

    def line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in body]
