"""The one rule for a label a user chooses: a backbone's `NAME` (`bench evaluate -m NAME=SPEC`,
`bench.api.evaluate(models={NAME: ...})`, a study's backbone names), a study's name and its
dataset names.

A label is shown in tables and figures, keys results rows, and names files and folders (a
study's datasets, a site's pages), so it is held to what every one of those takes as written:
at most 64 characters of letters, digits, space and `. _ + - ( )`, first a letter or digit
(never `.`, `..` or a hidden name), last not a space. Anything else is refused where it is
entered, in one line saying the rule. Labels already in older results folders are not refused
where they are read: figures draw them as plain text and a site names their pages by a hash.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable, TypeVar

from bench.core.errors import BenchError

Draw = TypeVar("Draw", bound=Callable[..., Any])

MAX_LABEL = 64
RULE = (f"1 to {MAX_LABEL} characters: letters, digits, space and . _ + - ( ), the first a letter or digit, "
        "the last not a space")
_LABEL = re.compile(rf"[A-Za-z0-9](?:[A-Za-z0-9 ._+()-]{{0,{MAX_LABEL - 2}}}[A-Za-z0-9._+()-])?")


def is_label(value: object) -> bool:
    """Whether `value` is a label a user may choose (see the module's rule)."""
    return isinstance(value, str) and _LABEL.fullmatch(value) is not None


def check_label(value: object, what: str) -> str:
    """`value` when it is a label; otherwise BenchError naming `what`, the value (shortened, with
    control characters escaped, so the message stays one line) and the rule."""
    if is_label(value):
        return value  # type: ignore[return-value]
    shown = repr(value) if not isinstance(value, str) or len(value) <= 40 else f"{value[:40]!r}… ({len(value)} characters)"
    raise BenchError(f"{what}: {shown} is not a valid name; a name is {RULE}")


def drawn_as_written(draw: Draw) -> Draw:
    """`draw` (a function that makes and saves a matplotlib figure) with mathtext off throughout,
    so a label holding `$` (an older results folder, a spec's path) is drawn as written rather
    than parsed as TeX, which ended in a ParseSyntaxException traceback. Off for the whole call:
    matplotlib lays tick labels and legends out when the figure is saved, not when they are set."""

    @functools.wraps(draw)
    def plain(*args: Any, **kwargs: Any) -> Any:
        import matplotlib

        with matplotlib.rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)

    return plain  # type: ignore[return-value]
