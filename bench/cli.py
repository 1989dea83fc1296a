"""The `bench` command line: assembles the command groups and turns bad input into exit 2.

Every user error (BenchError, or a usage error from the option parser) prints one
line on stderr and exits with code 2; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import shlex
import sys
from typing import Sequence

import typer

from bench.commands import data, demo, evaluate, imports, leaderboard, models, report, run, subspace, zoo
from bench.core.errors import BenchError

app = typer.Typer(
    name="bench",
    help="BindingBench: does a vision backbone bind object features? Generate, evaluate, compare.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # plain help: rich markup would eat the `[default: ...]`-style brackets of help texts and
    # print a `<bool>` metavar beside every flag
    rich_markup_mode=None,
)
for _module in (data, models, zoo, imports, evaluate, leaderboard, report, run, demo, subspace):
    _module.register(app)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns (and exits with) the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    try:
        # the command line as typed, for commands that record it (a results row's `command`)
        code = app(args=args, prog_name="bench", standalone_mode=False, obj={"command": shlex.join(["bench", *args])})
    except BenchError as e:
        if debug:
            raise
        _error(str(e))
        code = 2
    except KeyboardInterrupt:
        _error("interrupted")
        code = 130
    except OSError as e:  # an unwritable or vanished path, a full disk: the user's to fix, not a bug
        if debug:
            raise
        from bench.core.resources import disk_full

        where = f"{e.filename}: " if e.filename else ""
        hint = "free space and run again" if disk_full(e) else "check the path exists and is writable"
        _error(f"{where}{e.strerror or e} ({hint})")
        code = 2
    except Exception as e:  # the option parser's usage errors carry their own exit code
        if not (hasattr(e, "format_message") and hasattr(e, "exit_code")) or debug:
            raise
        _error(e.format_message().replace("\n", " "))
        code = e.exit_code
    code = code if isinstance(code, int) else 0
    if argv is None:
        sys.exit(code)
    return code


def _error(message: str) -> None:
    """One line, always: a multi-line message would read as a traceback to scripts."""
    print(f"bench: error: {' '.join(message.split())}", file=sys.stderr)
