"""Output helpers shared by commands: tables in four formats, progress on stderr."""

from __future__ import annotations

import csv
import io
import json
import sys
import time
from contextlib import contextmanager
from enum import Enum
from typing import Any, Iterator, Sequence

from rich.console import Console
from rich.errors import MarkupError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

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
    for k, c in enumerate(columns):
        # a name is never cut (`oracle:obje…`): a name column is at least as wide as its longest name
        names = [len(_plain(row[k])) for row in cells] if c in NAME_COLUMNS else []
        table.add_column(c, min_width=min(max(names, default=0), 60) or None, overflow="fold")
    for row in cells:
        table.add_row(*row)
    # A terminal gets its own width; a pipe or file gets the table's natural width, however wide,
    # rather than wrapped or cropped cells (nothing reflows a log line).
    tty = sys.stdout.isatty()
    width = max(100, Console().width) if tty else Console(width=10**4).measure(table).maximum
    console = Console(file=io.StringIO(), force_terminal=tty, width=width)
    console.print(table)
    return console.file.getvalue().rstrip("\n")


#: Columns that hold names (backbones, datasets): never folded or cut.
NAME_COLUMNS = ("backbone", "dataset", "spec", "model")


def _plain(markup: str) -> str:
    """A cell's text as printed (its rich markup removed)."""
    try:
        return Text.from_markup(markup).plain
    except MarkupError:
        return markup


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
    """A rich progress bar on stderr; yields a handle with `advance(n)`, `set_total(n)` and `describe(text)`.

    Written to a file or a pipe (no terminal to redraw in), progress is whole lines instead:
    one per tenth of the total or per `LOG_EVERY_S` seconds, and one at the end, so a log
    never stops mid-line and `tail -f` shows it moving."""
    if not stderr.is_terminal:
        handle = _LineProgress(description, total)
        yield handle
        handle.finish()
        return
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=stderr, transient=False) as p:
        task = p.add_task(description, total=total)

        class _Handle:
            def advance(self, n: int = 1) -> None:
                p.advance(task, n)

            def set_total(self, n: int) -> None:
                p.update(task, total=n)

            def describe(self, text: str) -> None:
                p.update(task, description=text)

        yield _Handle()


#: Seconds between two progress lines written to a non-terminal.
LOG_EVERY_S = 30.0


class _LineProgress:
    """`progress_bar`'s handle for a non-terminal stderr: whole lines, never a redrawn one."""

    def __init__(self, description: str, total: int | None) -> None:
        self.description, self.total, self.done = description, total, 0
        self.t0 = self.last = time.monotonic()
        self.step = 0  # tenths of the total already reported

    def set_total(self, n: int) -> None:
        self.total = n

    def describe(self, text: str) -> None:
        self.description = text

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        step = int(10 * self.done / self.total) if self.total else 0
        if step > self.step or now - self.last >= LOG_EVERY_S:
            self.step = max(step, self.step)
            if self.total is None or self.done < self.total:
                self._line(now)

    def finish(self) -> None:
        self._line(time.monotonic())

    def _line(self, now: float) -> None:
        self.last = now
        of = f"/{self.total}" if self.total else ""
        print(f"{self.description}: {self.done}{of} ({now - self.t0:.0f} s)", file=sys.stderr, flush=True)
