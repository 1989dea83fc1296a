"""A results folder as a view reads it: the selected rows (`store.load_selected`), with what the
selection set aside said once, and the leaderboard of those rows. `bench leaderboard`, `compare`
and `plot` all start here, so each says the set-aside note the same way and refuses an empty
folder in the same words."""

from __future__ import annotations

import os
from typing import Any, Callable

from bench.core.console import wrap
from bench.core.errors import BenchError
from leaderboards.board import Leaderboard, build_leaderboard
from leaderboards.store import load_selected


def selected_rows(results_dir: str | os.PathLike, *, fingerprint: str | None = None, include_limited: bool = False,
                  show_old: bool = False, say: Callable[[str], None] | None = None,
                  required: bool = False) -> list[dict[str, Any]]:
    """The rows of `results_dir` one comparison may use (each backbone's newest weights and probe
    settings, one measurement per task and dataset); `say` hears the note on what was set aside,
    wrapped to the terminal's table width. `required`: a folder without rows is refused (naming
    what was set aside), before anything is said."""
    selected = load_selected(results_dir, fingerprint=fingerprint, include_limited=include_limited, show_old=show_old)
    if required and not selected.rows:
        aside = f"; {selected.note}" if selected.note else ""
        raise BenchError(f"results: no runs in {results_dir} (run `bench evaluate` or `bench demo` first){aside}")
    if selected.note and say is not None:
        say(wrap(selected.note))
    return selected.rows


def load_board(results_dir: str | os.PathLike, *, fingerprint: str | None = None, include_limited: bool = False,
               show_old: bool = False, say: Callable[[str], None] | None = None,
               **selection: Any) -> tuple[list[dict[str, Any]], Leaderboard]:
    """The selected rows of `results_dir` (refused when there are none) and their leaderboard
    (`selection`: `build_leaderboard`'s dataset, task, metric, probes, tokens, layer, reference)."""
    rows = selected_rows(results_dir, fingerprint=fingerprint, include_limited=include_limited, show_old=show_old,
                         say=say, required=True)
    return rows, build_leaderboard(rows, **selection)
