"""Console output below the CLI: tables in every format, data on stdout, progress on stderr."""

from __future__ import annotations

import csv
import io
import json
import re
import sys
import textwrap
import time
from contextlib import contextmanager
from enum import Enum
from typing import Any, Iterator, Sequence

from rich.cells import cell_len
from rich.console import Console
from rich.errors import MarkupError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from bench.core.numbers import readable

stderr = Console(stderr=True)


class Format(str, Enum):
    table = "table"
    markdown = "markdown"
    csv = "csv"
    json = "json"


#: The width a summary table fits unless all its columns are asked for (`--wide`).
TABLE_WIDTH = 100


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], fmt: Format, title: str | None = None,
                 width: int | None = None) -> str:
    """Rows as text in the given format. CSV and JSON keep full-precision floats (for machines);
    table and markdown show them for people (`bench.core.numbers.readable`).

    A table fits `width` characters whether or not stdout is a terminal: cells wrap, and columns
    that cannot fit even wrapped are left out from the right, named in a last line. With `width`
    None a terminal gets its own width (at least 100) and a pipe or file the table's natural
    width, however wide, rather than wrapped cells (nothing reflows a log line)."""
    if fmt == Format.json:
        return json.dumps([{c: r.get(c) for c in columns} for r in rows], indent=2, default=str)
    if fmt == Format.csv:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(columns)
        w.writerows([[_machine_cell(r.get(c)) for c in columns] for r in rows])
        return buf.getvalue().rstrip("\n")
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    if fmt == Format.markdown:
        lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
        return "\n".join(([f"**{title}**", ""] if title else []) + lines)
    tty = sys.stdout.isatty()
    if width is None:
        natural = _measure(_rich_table(cells, columns, title)).maximum
        width = max(100, Console().width) if tty else natural
    shown = len(columns)
    while True:
        text = _fitted(_rich_table([row[:shown] for row in cells], columns[:shown], title), width, tty)
        if text is not None or shown == 1:
            break
        shown -= 1
    if text is None:  # one column wider than the width: let it run over
        text = _printed(_rich_table([row[:1] for row in cells], columns[:1], title), 10**4, tty)
    if shown < len(columns):
        text += "\n" + wrap(f"{len(columns) - shown} more column(s): {', '.join(columns[shown:])} "
                             "(--wide shows every column)", width)
    return text


def wrap(text: str, width: int = TABLE_WIDTH) -> str:
    """Prose for a terminal in lines of at most `width` characters, its paragraphs kept; a command in
    backquotes is never split across lines, so it can be copied whole (one longer than `width`
    runs over)."""
    def keep(m: re.Match) -> str:
        return m.group(0).replace(" ", "\x00")

    return "\n".join(textwrap.fill(re.sub(r"`[^`]*`", keep, para), width, break_long_words=False,
                                    break_on_hyphens=False).replace("\x00", " ") if para else ""
                     for para in text.split("\n"))


def _fitted(table: Table, width: int, tty: bool) -> str | None:
    """The table printed in at most `width` characters a line, cells wrapped; None when it cannot
    be. Rich's column arithmetic can overshoot by a character or two, so the printed lines are
    measured and the table printed narrower until they fit."""
    target, minimum = width, _measure(table).minimum
    while target >= minimum:
        text = _printed(table, target, tty)
        over = max((cell_len(Text.from_ansi(line).plain) for line in text.splitlines()), default=0) - width
        if over <= 0:
            return text
        target -= over
    return None


def _printed(table: Table, width: int, tty: bool) -> str:
    console = Console(file=io.StringIO(), force_terminal=tty, width=width)
    console.print(table, crop=False)
    return console.file.getvalue().rstrip("\n")


def _rich_table(cells: Sequence[Sequence[str]], columns: Sequence[str], title: str | None) -> Table:
    table = Table(title=title)
    for k, c in enumerate(columns):
        # a name is never cut (`oracle:obje…`): a name column is at least as wide as its longest name
        names = [len(_plain(row[k])) for row in cells] if c in NAME_COLUMNS else []
        table.add_column(c, min_width=min(max(names, default=0), 60) or None, overflow="fold")
    for row in cells:
        table.add_row(*row)
    return table


def _measure(table: Table) -> Any:
    """The table's (minimum, maximum) width: every cell wrapped at its longest word, or none wrapped."""
    return Console(width=10**4).measure(table)


#: Columns that hold names (backbones, datasets): never folded or cut.
NAME_COLUMNS = ("backbone", "dataset", "spec", "model")


def _plain(markup: str) -> str:
    """A cell's text as printed (its rich markup removed)."""
    try:
        return Text.from_markup(markup).plain
    except MarkupError:
        return markup


def _cell(v: Any) -> str:
    """A value for people: floats without -0 or scientific notation (`bench.core.numbers.readable`)."""
    if v is None:
        return ""
    if isinstance(v, float):
        return readable(v)
    return str(v)


def _machine_cell(v: Any) -> str:
    """A CSV value: floats at full precision (repr round-trips exactly)."""
    if v is None:
        return ""
    return repr(v) if isinstance(v, float) else str(v)


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
