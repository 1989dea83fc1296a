"""`bench run STUDY`: one study file names a whole comparison; run it, making only what is missing.
`bench studies`: the studies shipped with the package."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

import typer

from bench import api
from bench.commands.common import TABLE_WIDTH, Format, echo, render_table, stderr, wrap
from bench.core.errors import BenchError
from bench.core.paths import output_path


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("studies")(studies)


def run(
    ctx: typer.Context,
    study: str = typer.Argument(..., help="A study file (TOML), or the name of a shipped study (`bench studies`)."),
    out: Optional[str] = typer.Option(None, "--out", "-o", metavar="DIR", help="Write datasets, results (and a private cache) here [default: ./NAME after the study, or NAME-2, … when one of another study or other settings is there]."),
    values: list[str] = typer.Option([], "--set", help="VAR=VALUE for the study's ${VAR} references (repeatable; else the environment, else the study's default)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (datasets, row sets, what results hold, disk, time) and stop; loads no model."),
    executor: str = typer.Option("local", help="local (in this process) or ray (shards and probes as Ray tasks)."),
    address: Optional[str] = typer.Option(None, help="--executor ray: the cluster, auto or ray://HOST:PORT [a local Ray]."),
    fmt: Format = typer.Option(Format.table, "--format", help="Leaderboard format."),
) -> None:
    """Run a study: check the whole file, print the plan, make the datasets and fit the rows that are missing, rank."""
    run_and_show(study, _variables(values), None if out is None else output_path(out, "out"), dry_run=dry_run,
                   executor=executor, address=address, fmt=fmt, command=(ctx.obj or {}).get("command"))


def run_and_show(study: str, variables: Mapping[str, str], out: Path | None, *, dry_run: bool = False,
                   executor: str = "local", address: str | None = None, fmt: Format = Format.table,
                   command: str | None = None) -> None:
    """`bench run` (and `bench demo`, the demo study): the plan alone (`dry_run`), or the run
    (`api.run_and_report`) with its leaderboards, the study's notes, where everything is and what
    to run next."""
    if dry_run:
        for line in api.study_plan_lines(study, variables, out):
            echo(line)
        return

    def say(line: str) -> None:
        stderr.print(line, soft_wrap=True, markup=False, highlight=False)

    def show(plan: Any) -> None:  # once the whole study passed its checks: a refusal is the only line
        for line in plan.lines():
            say(line)

    done = api.run_and_report(study, variables, out, executor=executor, address=address, fmt=fmt.value,
                              command=command, on_plan=show, say=say)
    if done.set_aside:
        say(done.set_aside)
    echo(done.board)
    if fmt in (Format.table, Format.markdown) and done.study.notes:
        echo("\n" + wrap(done.study.notes, TABLE_WIDTH))
    say(f"site: {_shown(done.pages[0])} (open it in a browser; nothing in it is fetched from a network)")
    fitted = "nothing to fit" if not done.run.written else f"wrote {len(done.run.written)} run file(s)"
    say(f"{done.study.name} finished in {done.seconds:.0f} s ({fitted}; {done.run.skipped} row(s) were there "
        f"already); its datasets, results and activation cache are in {_shown(done.run.out)}/ (kept; a run of the "
        "same study and settings there reuses them)." + (" Next:" if done.study.next else ""))
    for line in done.next:
        say(f"  {line}")


def _shown(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return str(path)


def _variables(values: list[str]) -> dict[str, str]:
    out = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise BenchError(f"set: expected VAR=VALUE, got {item!r}")
        out[name.strip()] = value
    return out


def studies(fmt: Format = typer.Option(Format.table, "--format")) -> None:
    """List the studies shipped with the package (`bench run NAME`)."""
    rows = [{"study": name, "description": text} for name, text in api.shipped_studies().items()]
    echo(render_table(rows, ["study", "description"], fmt, title="shipped studies (bench run NAME)", width=TABLE_WIDTH))
