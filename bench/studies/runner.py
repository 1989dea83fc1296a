"""Running a study: make the datasets it lacks, evaluate the rows it lacks, then its leaderboards.

Every evaluation goes through `evaluators.runner.request.EvaluationRequest` and `run_evaluation`, the path
`bench evaluate` and `bench.api.evaluate` take, so a study's rows are theirs, and the results
identity decides what is missing: rows already in the study's results are skipped, and a run
killed at any point (even `kill -9`) resumes where it stopped when started again — datasets
resume their unfinished shards, every backbone's rows are written atomically as it finishes,
and interrupted activation-cache entries resume.

Before anything is made the whole study is checked against this machine (`planning.check_run`),
so a refusal leaves no folder behind; the folder is then this run's alone (an `flock`, which
dies with its process) until it ends.

Zoo models the study names that are not trained yet train in a second process while the
other backbones are evaluated (the demo's two cores: one trains, one evaluates).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from bench.core.environ import environment
from bench.core.errors import BenchError
from bench.studies.planning import (LOCK, MANIFEST, DatasetStep, StudyPlan, check_folder, check_run, generator_config,
                                    plan_study)
from bench.studies.spec import BackboneEntry, EvaluateBlock, Study
from bench.studies.sweeps import fit_subspaces, sweep_plan

#: What the study's site was last built from (`site_inputs`): a rerun that wrote nothing keeps that site.
SITE_STAMP = ".bench-site.json"


@dataclass(frozen=True)
class StudyRun:
    """What a run did: its plan, the folder, the results folder, the run files it wrote and the
    rows it found already there."""

    plan: StudyPlan
    out: Path
    results: Path
    written: tuple[Path, ...]
    skipped: int
    seconds: float


def run_study(study: Study, out: str | Path | None = None, *, executor: str = "local", address: str | None = None,
              progress: bool = True, command: str | None = None, say: Callable[[str], None] | None = None,
              on_plan: Callable[[StudyPlan], None] | None = None) -> StudyRun:
    """Run `study` into `out` (None: the default folder, `planning.choose_out`): what its plan
    says is missing, nothing else. `executor` "ray" renders and evaluates as Ray tasks (on the
    cluster at `address`); `command` goes into every row's provenance; `say` hears the stage
    lines (default: stderr when `progress`); `on_plan` hears the plan once the whole study has
    passed its checks (`planning.check_run`) and the folder is this run's: a refusal comes
    before anything is made, and alone."""
    t0 = time.perf_counter()
    say = say or (_stderr if progress else (lambda text: None))
    if study.unset:
        raise BenchError(f"{study.source}: ${{{study.unset[0]}}} is not set; pass --set {study.unset[0]}=VALUE or "
                         f"export {study.unset[0]}")
    if executor != "local":  # a bad executor or an unreachable cluster: refused before any work
        from bench.core.ray_cluster import require_ray

        require_ray(executor, address)
    elif address is not None:
        raise BenchError("executor: --address needs --executor ray")
    plan = plan_study(study, out)
    check_run(plan, executor)
    with _claimed(plan.out, study, command):
        # again, now that no other run can change the folder (the first plan says what it found there)
        plan = replace(plan_study(study, plan.out), out_note=plan.out_note)
        if on_plan is not None:
            on_plan(plan)
        written, skipped = _run(study, plan, executor, address, progress, command, say)
    return StudyRun(plan, plan.out, plan.out / "results", tuple(written), sum(skipped), time.perf_counter() - t0)


def _run(study: Study, plan: StudyPlan, executor: str, address: str | None, progress: bool, command: str | None,
         say: Callable[[str], None]) -> tuple[list[Path], list[int]]:
    """Make the plan's datasets, then fit its rows (the zoo's in a second process): the run
    files written and the counts of rows found already there."""
    results = plan.out / "results"
    written: list[Path] = []
    skipped: list[int] = []
    zoo = [b.spec for b in study.backbones.values() if b.spec.startswith("zoo:")]
    from evaluators.zoo.background import untrained, zoo_in_background

    waiting = set(untrained(zoo)) if executor == "local" else set()
    with _environment(study, plan.out):
        say(f"1/3 datasets of study {study.name} in {plan.out}")
        for step in plan.datasets:
            _make_dataset(step, executor, address, progress, say)
        work = _work(study, plan)  # what does not wait for the zoo first, in the study's order
        first = [(b, d, mine) for b, d, m in work if (mine := tuple(x for x in m if x.spec not in waiting))]
        later = [(b, d, mine) for b, d, m in work if (mine := tuple(x for x in m if x.spec in waiting))]
        with zoo_in_background(sorted(waiting), f"bench run {study.name}") as zoo_trained:
            if waiting:
                say(f"2/3 training {', '.join(sorted(waiting))} in a second process (once: reused from the cache "
                    f"afterwards) while evaluating {', '.join(_names(first)) or 'nothing else'}")
            else:
                say(f"2/3 evaluating {', '.join(_names(first + later))}")
            order = first + later
            for i, (block, dataset, models) in enumerate(first):
                written += _evaluate(study, block, dataset, models, results, executor, address, progress, command,
                                     skipped, _also(order, i, results, executor))
            if later:
                for spec, path in zoo_trained().items():
                    say(f"{spec} → {path}")
                say(f"2/3 evaluating {', '.join(_names(later))}")
            for i, (block, dataset, models) in enumerate(later, len(first)):
                written += _evaluate(study, block, dataset, models, results, executor, address, progress, command,
                                     skipped, _also(order, i, results, executor))
    return written, skipped


@contextlib.contextmanager
def _claimed(folder: Path, study: Study, command: str | None) -> Iterator[None]:
    """The study's folder, made if missing and held by this run until it ends: a second run
    into it (of this study or another) is refused in one line naming this one. The lock is an
    `flock` (`bench.core.locks`), so a run that dies, by kill -9 too, leaves nothing locked;
    one that ends removes its lock file while it still holds it (a run that opened the file
    meanwhile finds it gone, `same_file`, and locks a new one). Under the lock the folder is
    checked again (`check_folder`) and its manifest written."""
    from bench.core.locks import same_file, try_lock

    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK
    while True:
        fd = try_lock(lock, create=True)
        if fd is None:
            try:
                holder = " ".join(lock.read_text().split()) or "starting"
            except (OSError, UnicodeDecodeError):
                holder = "unknown"
            raise BenchError(f"out: {folder} is being written by another bench run ({holder}); wait for it to "
                             "finish or choose another --out")
        if same_file(fd, lock):
            break
        os.close(fd)  # removed by the run that held it as it ended: lock the new one
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}, {command or 'bench run ' + study.source}, since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        _write_manifest(folder, study, check_folder(folder, study))
        yield
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)


def _names(work: Sequence[tuple]) -> list[str]:
    """The backbones of some evaluations, each once (a control block's marked)."""
    out = []
    for block, _, models in work:
        control = block.options.get("control")
        out += [f"{m.name} (control {control})" if control else m.name for m in models]
    return list(dict.fromkeys(out))


def _work(study: Study, plan: StudyPlan) -> list[tuple[EvaluateBlock, DatasetStep, tuple]]:
    """One evaluation per (block, dataset, input settings): the block's backbones that share
    their input settings go in one `EvaluationRequest` (it takes one set), in the block's order."""
    steps = {s.entry.name: s for s in plan.datasets}
    out = []
    for block in study.blocks:
        for name in block.datasets:
            out += [(block, steps[name], group) for group in block.groups()]
    return out


def _also(work: Sequence[tuple[EvaluateBlock, DatasetStep, tuple]], i: int, results: Path, executor: str
          ) -> tuple[tuple[str, Any, tuple[str, ...]], ...]:
    """What evaluation `work[i]` extracts beside its own selections, from the same forward pass
    (`EvaluationRequest.also`): the layers and tokens of every later evaluation of `work` that reads
    one of its backbones on its dataset with the same extraction (dtype, limit, input settings) and
    still owes that backbone rows. The README's study reads every layer's class token, then every
    token of the last layer, of the same backbones: each runs through its model once, not twice."""
    from bench.core.tasks import TASKS
    from evaluators.runner.planning import held_rows

    block, step, models = work[i]
    mine = block.request(models, step.target, results_dir=results)
    if executor != "local" or not TASKS.get(mine.task).fills_also:
        return ()
    out: list[tuple[str, Any, tuple[str, ...]]] = []
    for later, later_step, later_models in work[i + 1:]:
        if later_step.target != step.target:
            continue
        for entry in (m for m in later_models if m in models):
            theirs = later.request([entry], step.target, results_dir=results)
            if (TASKS.get(theirs.task).fills_also and (theirs.dtype, theirs.limit) == (mine.dtype, mine.limit)
                    and held_rows(theirs) is None):
                out.append((entry.name, theirs.layer_request, tuple(theirs.token_choices)))
    return tuple(dict.fromkeys(out))


def _evaluate(study: Study, block: EvaluateBlock, step: DatasetStep, backbones: tuple, results: Path, executor: str,
              address: str | None, progress: bool, command: str | None, skipped: list[int],
              also: tuple = ()) -> list[Path]:
    """One `run_evaluation` of a block's backbones (sharing input settings) on one dataset, its
    extraction filling `also` too (`_also`), then, when the block sweeps interventions, its
    subspaces fitted (once, into the study folder) and a second of the intervened backbones they name."""
    from evaluators.runner.run import run_evaluation

    def run(entries: Sequence[BackboneEntry], also: tuple = ()) -> list[Path]:
        plan = block.request(entries, step.target, results_dir=results, executor=executor, address=address,
                             threads=study.threads, command=command, also=also)
        path = run_evaluation(plan, progress=progress, on_skipped=skipped.append)
        return [] if path is None else [path]

    written = run(backbones, also)
    if block.interventions is None:
        return written
    sweep = sweep_plan(block.interventions, backbones, step.entry.name, results.parent)
    fit_subspaces(sweep, step.target, device=block.options.get("device", "auto"), limit=block.options.get("limit"),
                  progress=progress, say=_stderr)
    first = backbones[0]
    return written + run([BackboneEntry(name, spec, first.image_size, first.mean, first.std, first.key)
                          for name, spec in sweep.backbones])


def _make_dataset(step: DatasetStep, executor: str, address: str | None, progress: bool,
                  say: Callable[[str], None]) -> None:
    """Render, import or check one dataset; one already made with the same settings is reused."""
    if step.status == "present":
        say(f"reusing the scenes in {step.target} (the same settings)")
        return
    if step.entry.kind == "import":
        from generators.importers import import_dataset

        import_dataset(step.entry.importer, step.entry.path, step.target, progress=progress, say=say,
                       **step.entry.options)
        return
    from bench.core.console import progress_bar
    from generators.engine import generate

    gen, config = generator_config(step.entry)
    shards = None
    if executor == "ray":
        from generators.ray_shards import ray_shards

        shards = ray_shards(address)
    t0 = time.perf_counter()
    with progress_bar(f"generate {step.target}") if progress else contextlib.nullcontext() as bar:
        card = generate(gen, config, step.target, progress=bar and bar.advance, on_start=bar and bar.set_total,
                        shards=shards, say=say)
    n = sum(s["n"] for s in card["splits"].values())
    say(f"wrote {n} scenes to {step.target} in {time.perf_counter() - t0:.1f} s")


def _write_manifest(folder: Path, study: Study, made: dict[str, Any] | None) -> None:
    """Record which study made the folder, with which settings (a later run of the same study and
    settings reuses it; another study is refused), unless its manifest (`made`) says so already."""
    if made is not None:
        return
    import bench
    from bench.core.dataset import write_json_atomic

    write_json_atomic({"made_by": "bench run", "study": study.name, "source": study.source,
                       "bench_version": bench.__version__, "settings": dict(study.settings)}, folder / MANIFEST)


@contextlib.contextmanager
def _environment(study: Study, folder: Path) -> Iterator[None]:
    """A study with `private_cache` keeps its activations in its own folder (unless
    $BINDINGBENCH_CACHE is set), so it leaves only the zoo in the user's cache; the zoo stays
    where it is trained."""
    if not study.private_cache:
        yield
        return
    from evaluators.zoo import ZOO_ENV, zoo_root

    with environment({ZOO_ENV: str(zoo_root()),
                      "BINDINGBENCH_CACHE": os.environ.get("BINDINGBENCH_CACHE") or str(folder / "cache")}):
        yield


def study_report(study: Study, results: Path, fmt: Any) -> tuple[str, str | None]:
    """What `bench run` prints of a study once its rows are in: its leaderboards (one per dataset ×
    task, under the study's first metric of the task; further metrics in tables, controls aside),
    rendered in `fmt` (terminal tables 100 columns wide). Returns the text for stdout and the note
    on rows set aside (None if none). The study's site is `study_site`."""
    from bench.core.console import TABLE_WIDTH, Format
    from leaderboards.board import build_leaderboard
    from leaderboards.metrics import METRICS
    from leaderboards.render import render_leaderboards
    from leaderboards.store import load_selected

    selected = load_selected(results)
    names = set(study.backbones)
    rows = [r for r in selected.rows if r["backbone"] in names]
    boards = []
    for dataset, task in dict.fromkeys((r["dataset"], r["task"]) for r in rows):
        metrics = [m for m in study.leaderboard_metrics if METRICS.get(m).task == task] or [None]
        boards.append(build_leaderboard(rows, dataset=dataset, task=task, metric=metrics[0],
                                        layer=study.leaderboard_layer))
        if fmt in (Format.table, Format.markdown):  # the same rows under further metrics, to compare
            for metric in metrics[1:]:
                board = build_leaderboard([r for r in rows if r.get("control") is None], dataset=dataset, task=task,
                                          metric=metric, layer=study.leaderboard_layer)
                boards += [board] if board.has_values else []
    return render_leaderboards(boards, fmt, TABLE_WIDTH if fmt == Format.table else None), selected.note


def site_inputs(done: StudyRun, datasets: Sequence[Path]) -> dict[str, Any]:
    """What a study's site is built from, as the file system stamps it: every file of its results
    folder and the card of every dataset shown (name, size, mtime), and the bench version drawing
    it. Equal stamps, equal site: a run that wrote nothing keeps the one it finds (`site_is_current`)."""
    import bench

    def stat(path: Path) -> list[Any]:
        st = path.stat()
        return [str(path.relative_to(done.out) if path.is_relative_to(done.out) else path), st.st_size, st.st_mtime_ns]

    files = sorted(p for p in done.results.rglob("*") if p.is_file()) if done.results.is_dir() else []
    return {"bench_version": bench.__version__, "results": [stat(p) for p in files],
            "datasets": [stat(d / "dataset.json") for d in datasets]}


def site_is_current(done: StudyRun, inputs: dict[str, Any]) -> list[Path] | None:
    """The study's site files (`index.html` first) when the last site built into its folder was
    built from `inputs` (its stamp, `SITE_STAMP`, written once that build had finished) and every
    file it wrote is still there; None when it must be built."""
    from bench.core.outdir import WrittenFiles

    try:
        stamp = json.loads((done.out / SITE_STAMP).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    index = done.out / "site" / "index.html"
    listed = WrittenFiles(index, "out")
    pages = [index, *(index.parent / n for n in sorted(listed.listed - {index.name}))]
    if stamp != inputs or listed.damaged or not all(p.is_file() for p in pages):
        return None
    return pages


def stamp_site(done: StudyRun, inputs: dict[str, Any]) -> None:
    """Record that the study's site was built from `inputs` (after the build: a build cut short leaves the
    previous stamp, which no longer matches)."""
    from bench.core.dataset import write_json_atomic

    write_json_atomic(inputs, done.out / SITE_STAMP)


def next_commands(study: Study, out: Path) -> list[str]:
    """The study's `next` commands, with `{out}` as the user would type the folder."""
    try:
        shown = str(Path(out).resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        shown = str(out)
    return [c.replace("{out}", shlex.quote(shown)) for c in study.next]


def _stderr(text: str) -> None:
    from bench.core.console import stderr

    stderr.print(text, soft_wrap=True, markup=False, highlight=False)
