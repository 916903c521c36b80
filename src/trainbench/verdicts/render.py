"""How a figure and a table are printed, in the terminal and in Markdown.

One number format (``number``) and one table (``Table``) for every printed table: the session
summary, the gate's and A/B's verdict, its Markdown for a CI job summary, the ladder report. A
missing value is ``-`` in the terminal and ``—`` in Markdown, where a lone hyphen reads as a glitch.
"""

from __future__ import annotations

from dataclasses import dataclass

MISSING = "-"
MARKDOWN_MISSING = "—"
NOT_PREDICTED = "n/a"  # a prediction asked for and not made: the summary gives the reason beside the table


def number(value: float | None, spec: str = ".4g", suffix: str = "") -> str:
    """``value`` in format ``spec`` followed by ``suffix``, or ``MISSING`` where it was not measured."""
    return MISSING if value is None else format(value, spec) + suffix


def listed(items, shown: int, separator: str = ", ") -> str:
    """The first ``shown`` of ``items`` joined by ``separator``, and how many more there are."""
    items = list(items)
    more = len(items) - shown
    return separator.join(str(item) for item in items[:shown]) + (f"{separator}and {more} more" if more > 0 else "")


def change(fraction: float | None) -> str:
    """A relative change, signed: ``+12.5%``."""
    return number(fraction, "+.1%")


def interval(ratios: tuple[float, float] | list[float] | None) -> str:
    """An interval of ratios as changes: (0.9, 1.05) -> ``-10.0%..+5.0%``."""
    return MISSING if not ratios else f"{change(ratios[0] - 1)}..{change(ratios[1] - 1)}"


@dataclass(frozen=True)
class Column:
    title: str
    left: bool = False  # text is left-aligned, figures right-aligned


@dataclass(frozen=True)
class Table:
    columns: tuple[Column, ...]
    rows: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"a row of {len(row)} cells in a table of {len(self.columns)} columns: {row}")

    def terminal(self) -> list[str]:
        """Fixed-width lines: the header, a rule of dashes, one line per row, columns two spaces apart."""
        header = tuple(c.title for c in self.columns)
        widths = [max(len(row[i]) for row in (header, *self.rows)) for i in range(len(self.columns))]

        def line(cells) -> str:
            return "  ".join(cell.ljust(w) if column.left else cell.rjust(w)
                             for cell, w, column in zip(cells, widths, self.columns))

        return [line(header), line(["-" * w for w in widths])] + [line(row) for row in self.rows]

    def markdown(self) -> list[str]:
        """A GitHub-flavoured Markdown table (figures right-aligned)."""
        align = "|" + "|".join("---" if c.left else "---:" for c in self.columns) + "|"
        return [_markdown_line(c.title for c in self.columns), align] + [_markdown_line(row) for row in self.rows]


def _markdown_line(cells) -> str:
    return "| " + " | ".join(_markdown_cell(cell) for cell in cells) + " |"


def _markdown_cell(text: str) -> str:
    if text == MISSING:
        return MARKDOWN_MISSING
    return str(text).replace("|", "\\|").replace("\n", " ")
