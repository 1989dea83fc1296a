"""Numbers as people read them in tables: never `-0.0`, never `-2.197e-08` for what is 0 at
the precision shown. Machine formats (CSV, JSON, Parquet) keep full-precision floats; only
text meant for reading goes through here."""

from __future__ import annotations

import math

#: Significant digits of a general table cell (`readable`), and the most decimals it shows.
SIGNIFICANT = 4
MAX_DECIMALS = 4


def fixed(value: float, digits: int) -> str:
    """`value` with `digits` decimals; a value that rounds to zero prints unsigned ("0.0", not "-0.0")."""
    text = f"{value:.{digits}f}"
    return text.lstrip("-") if float(text) == 0 else text


def readable(value: float) -> str:
    """A general table cell: `SIGNIFICANT` significant digits, at most `MAX_DECIMALS` decimals,
    trailing zeros dropped, never scientific notation (a value below the last decimal shown
    is "0"), large values as whole numbers."""
    if not math.isfinite(value):
        return str(value)
    if value == 0 or abs(value) < 0.5 * 10.0**-MAX_DECIMALS:
        return "0"
    decimals = min(MAX_DECIMALS, max(0, SIGNIFICANT - 1 - math.floor(math.log10(abs(value)))))
    text = fixed(value, decimals)
    return text.rstrip("0").rstrip(".") if "." in text else text


def plus_minus(value: float, lo: float | None, hi: float | None, scale: float = 1.0, digits: int = 1) -> str:
    """`value ± half the interval` (the interval [lo, hi]), scaled (100 for percentages), fixed-point."""
    text = fixed(value * scale, digits)
    if lo is not None and hi is not None:
        text += f" ± {fixed((hi - lo) / 2 * scale, digits)}"
    return text
