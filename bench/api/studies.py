"""Studies: one file names a whole comparison (datasets, backbones, probes, leaderboards); load,
plan and run it, then rank it and build its site."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from bench.api.arguments import PathLike, Say
from bench.api.boards import site

if TYPE_CHECKING:
    from bench.studies.planning import StudyPlan
    from bench.studies.runner import StudyRun
    from bench.studies.spec import Study


def shipped_studies() -> dict[str, str]:
    """The studies shipped with the package (`bench run NAME`): name -> one line about it."""
    from bench.studies.spec import shipped_studies as shipped

    return shipped()


def load_study(study: PathLike, variables: Mapping[str, str] | None = None, *, allow_unset: bool = False) -> Study:
    """A study file (a path, or a shipped study's name) read and checked whole: a
    `bench.studies.spec.Study`. `variables` fill its `${VAR}` references before the environment
    does (`bench run --set VAR=VALUE`); `allow_unset` (a dry run) leaves unset ones as written.
    A bad file raises BenchError naming the file and the key path."""
    from bench.studies.spec import load_study as load

    return load(study, variables, allow_unset=allow_unset)


def plan_study(study: Study, out: PathLike | None = None) -> StudyPlan:
    """What running `study` into `out` (None: its default folder in the working directory) will
    do, worked out without loading a model: a `bench.studies.planning.StudyPlan` (`.lines()`
    prints it: datasets, row sets and the rows already held, disk, estimated time)."""
    from bench.studies.planning import plan_study as plan

    return plan(study, out)


def study_plan_lines(study: PathLike, variables: Mapping[str, str] | None = None,
                     out: PathLike | None = None) -> list[str]:
    """`bench run --dry-run`: the plan of the study file `study` into `out`, one line each, its
    unset `${VAR}` references left as written; loads no model and writes nothing."""
    return plan_study(load_study(study, variables, allow_unset=True), out).lines()


def run_study(study: Study, out: PathLike | None = None, *, executor: str = "local", address: str | None = None,
              progress: bool = False, command: str | None = None, on_plan: Callable[[StudyPlan], None] | None = None,
              say: Say = None) -> StudyRun:
    """Run `study` into `out`: make the datasets it lacks and fit the rows it lacks (the rows
    `evaluate` would write), locally or as Ray tasks; a run stopped at any point resumes when
    started again. The whole study is checked first (its datasets, devices, backbones' files),
    and a refusal creates nothing; one run of a folder at a time. `on_plan(plan)` hears the plan
    once it is checked; `say` the stage lines (default: stderr when `progress`). Returns a
    `bench.studies.runner.StudyRun` (its folder, results, files written)."""
    from bench.studies.runner import run_study as run

    return run(study, out, executor=executor, address=address, progress=progress, command=command, on_plan=on_plan,
               say=say)


def study_site(done: StudyRun, say: Say = None) -> list[Path]:
    """Build a finished study run's static site (`bench site`: its boards, a page per backbone and
    per dataset, with each dataset's preview) into the run's folder, `site/`; returns the files
    written, `index.html` first. `done`: what `run_study` returned. A site built from the same results
    and datasets is kept as it is (`runner.site_is_current`), so a rerun with nothing to do draws nothing."""
    from bench.studies.runner import site_inputs, site_is_current, stamp_site

    datasets = [step.target for step in done.plan.datasets if (step.target / "dataset.json").exists()]
    inputs = site_inputs(done, datasets)
    kept = site_is_current(done, inputs)
    if kept is not None:
        return kept
    pages = site(done.results, done.out / "site", datasets=datasets, say=say)
    stamp_site(done, inputs)
    return pages


def study_report(study: Study, results: PathLike, fmt: str = "table") -> tuple[str, str | None]:
    """A study's leaderboards over `results`, rendered as `fmt` (table, markdown, csv, json), and
    the note on rows set aside (None if none)."""
    from bench.core.console import Format
    from bench.studies.runner import study_report as report

    return report(study, Path(results), Format(fmt))


def study_next_commands(study: Study, out: PathLike) -> list[str]:
    """The commands a study suggests once it has run (its `next`), with its folder filled in."""
    from bench.studies.runner import next_commands

    return next_commands(study, Path(out))


@dataclass(frozen=True)
class StudyOutcome:
    """What `run_and_report` did and what it has to show: the study, its run, its leaderboards
    rendered (`board`) with the note on rows set aside, the site's files (`index.html` first), the
    commands it suggests next, and the seconds it took from loading the file to the site."""

    study: Study
    run: StudyRun
    board: str
    set_aside: str | None
    pages: list[Path]
    next: list[str]
    seconds: float


def run_and_report(study: PathLike, variables: Mapping[str, str] | None = None, out: PathLike | None = None, *,
                   executor: str = "local", address: str | None = None, fmt: str = "table",
                   command: str | None = None, on_plan: Callable[[StudyPlan], None] | None = None,
                   say: Say = None) -> StudyOutcome:
    """`bench run` (and `bench demo`, the demo study) as one call: load the study file, run it
    (`run_study`, with progress bars), rank its results as `fmt` and build its site. `on_plan` hears
    the checked plan before any work; `say` hears the stage lines."""
    t0 = time.perf_counter()
    loaded = load_study(study, variables)
    done = run_study(loaded, out, executor=executor, address=address, progress=True, command=command,
                     on_plan=on_plan, say=say)
    if say is not None:
        say("3/3 leaderboard")
    board, note = study_report(loaded, done.results, fmt)
    pages = study_site(done, say=lambda line: None)
    return StudyOutcome(loaded, done, board, note, pages, study_next_commands(loaded, done.out),
                        time.perf_counter() - t0)
