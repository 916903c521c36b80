"""Numbers and tables as printed in the terminal and in Markdown."""

import pytest

from trainbench.render import Column, Table, change, interval, number

TABLE = Table((Column("case", left=True), Column("samples/s"), Column("note", left=True)),
              (("mlp-baseline", number(1234.5678, ".1f"), "ok"), ("resnet18-amp_bf16", number(None), "a|b")))


def test_a_number_has_its_format_and_a_missing_one_a_dash():
    assert number(1234.5678) == "1235" and number(0.000123456) == "0.0001235"
    assert number(2.5, ".2f", "x") == "2.50x" and number(None, ".2f", "x") == "-"
    assert change(-0.2) == "-20.0%" and change(None) == "-"
    assert interval((0.9, 1.05)) == "-10.0%..+5.0%" and interval(None) == "-"


def test_the_terminal_table_sizes_columns_to_their_widest_cell_and_aligns_figures_right():
    header, rule, first, second = TABLE.terminal()
    assert header == "case               samples/s  note"
    assert rule == "-----------------  ---------  ----"
    assert first == "mlp-baseline          1234.6  ok  "
    assert second == "resnet18-amp_bf16          -  a|b "


def test_the_markdown_table_aligns_figures_escapes_pipes_and_marks_missing_values():
    header, align, first, second = TABLE.markdown()
    assert header == "| case | samples/s | note |" and align == "|---|---:|---|"
    assert first == "| mlp-baseline | 1234.6 | ok |"
    assert second == "| resnet18-amp_bf16 | — | a\\|b |"


def test_a_row_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match="a row of 1 cells in a table of 2 columns"):
        Table((Column("a"), Column("b")), (("x",),))
