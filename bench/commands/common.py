"""Output helpers shared by commands: tables in four formats, progress on stderr."""

from __future__ import annotations

import csv
import io
import json
import sys
from contextlib import contextmanager
from enum import Enum
from typing import Any, Iterator, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

stderr = Console(stderr=True)


class Format(str, Enum):
    table = "table"
    markdown = "markdown"
    csv = "csv"
    json = "json"


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], fmt: Format, title: str | None = None) -> str:
    """Rows as text in the given format (json keeps native values; others show strings)."""
    if fmt == Format.json:
        return json.dumps([{c: r.get(c) for c in columns} for r in rows], indent=2, default=str)
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    if fmt == Format.csv:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(columns)
        w.writerows(cells)
        return buf.getvalue().rstrip("\n")
    if fmt == Format.markdown:
        lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
        return "\n".join(([f"**{title}**", ""] if title else []) + lines)
    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for row in cells:
        table.add_row(*row)
    # A terminal gets its own width; a pipe or file gets room for a wide table rather than
    # wrapped cells (nothing reflows a log line).
    width = max(100, Console().width) if sys.stdout.isatty() else 200
    console = Console(file=io.StringIO(), force_terminal=sys.stdout.isatty(), width=width)
    console.print(table)
    return console.file.getvalue().rstrip("\n")


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.6g}"
    return str(v)


def echo(text: str) -> None:
    """Data goes to stdout."""
    print(text)


@contextmanager
def progress_bar(description: str, total: int | None = None) -> Iterator[Any]:
    """A rich progress bar on stderr; yields `advance(n)` callable and a `set_total(n)`."""
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=stderr, transient=False) as p:
        task = p.add_task(description, total=total)

        class _Handle:
            def advance(self, n: int = 1) -> None:
                p.advance(task, n)

            def set_total(self, n: int) -> None:
                p.update(task, total=n)

        yield _Handle()
