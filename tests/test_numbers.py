"""Numbers for people (no -0, no scientific notation for what rounds to 0) and tables that fit
100 columns, while CSV and JSON keep every digit."""

from __future__ import annotations

import csv
import io
import json
import re

from bench.commands.common import Format, render_table
from bench.core.numbers import fixed, plus_minus, readable

#: "-0", "-0.0", "-0.00" as a whole number in text
NEGATIVE_ZERO = re.compile(r"(?<![\w.])-0(\.0*)?(?![\d.])")


def test_values_that_round_to_zero_print_as_zero_without_sign_or_exponent():
    assert fixed(-0.04, 1) == "0.0" and fixed(-0.0, 2) == "0.00" and fixed(-0.06, 1) == "-0.1"
    assert readable(-2.197e-08) == "0" and readable(-0.0) == "0" and readable(4e-5) == "0"
    assert readable(0.00012) == "0.0001" and readable(0.123456) == "0.1235" and readable(32.9123) == "32.91"
    assert readable(-1.5) == "-1.5" and readable(123456.7) == "123457" and readable(7.0) == "7"
    assert plus_minus(-0.0004, -0.002, 0.0012, 100.0) == "0.0 ± 0.2"
    assert plus_minus(0.5, None, None) == "0.5"


def wide_rows(n: int = 12) -> tuple[list[dict], list[str]]:
    columns = ["backbone", *(f"metric_{k}" for k in range(n))]
    rows = [{"backbone": name, **{f"metric_{k}": -2.197e-08 * (k + 1) + k for k in range(n)}}
            for name in ("random:dinov2-small", "oracle:objects")]
    return rows, columns


def test_a_table_fits_its_width_and_names_what_it_left_out():
    rows, columns = wide_rows(40)
    text = render_table(rows, columns, Format.table, title="t", width=100)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert "random:dinov2-small" in text  # names are never cut
    words = " ".join(text.split())
    assert "more column(s): " in words and "metric_39" in words and "--wide shows every column" in words
    assert "e-0" not in text and not NEGATIVE_ZERO.search(text)  # -2.2e-08 shows as 0
    natural = render_table(rows, columns, Format.table, title="t")  # not a terminal: its natural width
    assert max(len(line) for line in natural.splitlines()) > 100 and "more column(s)" not in natural


def test_a_narrow_table_wraps_cells_instead_of_dropping_columns():
    rows = [{"backbone": "oracle:objects", "note": "β*_paper: L_O < L_F; β*_paper: L_O > H(O); not converged"}]
    text = render_table(rows, ["backbone", "note"], Format.table, width=40)
    assert max(len(line) for line in text.splitlines()) <= 40 and "converged" in text
    assert "more column(s)" not in text


def test_csv_and_json_keep_full_precision_floats():
    rows = [{"a": -2.197e-08, "b": 0.1234567890123}]
    parsed = next(csv.DictReader(io.StringIO(render_table(rows, ["a", "b"], Format.csv))))
    assert float(parsed["a"]) == -2.197e-08 and float(parsed["b"]) == 0.1234567890123
    assert json.loads(render_table(rows, ["a", "b"], Format.json)) == rows
