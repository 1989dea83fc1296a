"""`bench evaluate`: binding or IsSameObject probes on a dataset for one or more backbones."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from bench import api
from bench.commands.common import TABLE_WIDTH, Format, echo, parse_floats, registry_help, render_table, stderr
from bench.core.numbers import fixed, plus_minus
from bench.core.tasks import DEFAULT_TASK, TASKS


def short_summary(rows: list[dict[str, Any]], task: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The default table (fits 100 columns): the row key (`Task.short_keys`), each headline number
    (`Task.short_metrics`) as `value ± half-interval` (%, or as is to 3 decimals for a metric in other units,
    e.g. a loss), `s %` the probe's sensitivity (the share
    of a planted binding it recovers here, for a task whose rows carry it) and a note (the checks
    that fired, or the error)."""
    entry = TASKS.get(task)
    names = [name for name, _ in entry.short_metrics] + (["s %"] if entry.sensitivity else [])
    shown = {m.name: (100.0, 1) if m.unit == "%" else (1.0, 3) for m in entry.metrics}
    out = []
    for row in rows:
        line = {k: row.get(k) for k in entry.short_keys}
        for name, metric in entry.short_metrics:
            value = row.get(metric)
            line[name] = None if value is None else plus_minus(value, row.get(f"{metric}_lo"), row.get(f"{metric}_hi"),
                                                              *shown.get(metric, (100.0, 1)))
        if entry.sensitivity and row.get("sensitivity") is not None:
            line["s %"] = fixed(row["sensitivity"] * 100, 0)
        line["note"] = row.get("error") or row.get("checks")
        out.append(line)
    return out, [*entry.short_keys, *names, "note"]


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    helps = {"task": api.tasks_help, "layers": api.layers_help, "probes": api.probes_help,
             "tokens": api.tokens_help}
    app.command("evaluate", cls=registry_help(helps))(evaluate)


def _split(items: list[str]) -> list[str]:
    """Repeatable options also accept comma-separated values."""
    return [p.strip() for item in items for p in item.split(",") if p.strip()]


def evaluate(
    ctx: typer.Context,
    model: list[str] = typer.Option(..., "--model", "-m", help="Backbone spec, or NAME=SPEC to show it as NAME (repeatable; see `bench models`)."),
    dataset: Path = typer.Option(..., "--dataset", "-d", help="Dataset directory (from `bench generate`)."),
    task: str = typer.Option(DEFAULT_TASK, help="The task (listed by `--help` from the registry)."),
    layers: Optional[str] = typer.Option(None, help="Hidden states (listed by `--help` with each task's default)."),
    tokens: list[str] = typer.Option([], help="Which tokens the probes read (listed by `--help` from the registry)."),
    probes: list[str] = typer.Option([], help="Probe families (listed by `--help` from the registry)."),
    seeds: list[str] = typer.Option(["0"], help="Probe seeds (repeatable or comma-separated)."),
    device: str = typer.Option("auto", help="auto, cpu or cuda (used for extraction and probe training)."),
    dtype: str = typer.Option("fp32", help="Backbone dtype for extraction: fp32, bf16, fp16."),
    epochs: Optional[int] = typer.Option(None, help="Maximum probe epochs (early-stopped on the validation plateau)."),
    unanchored: bool = typer.Option(False, help="For a dataset without exact priors (an older or hand-made card): train every probe from p = 1/2 and label the rows `prior: none`."),
    control: Optional[str] = typer.Option(None, "--control", help="A control null instead of the real O: resampled-o (each scene's O redrawn from the exact p(O|F), independent of the image: true β* = 0 for any backbone). Rows say so; controls are never ranked."),
    results: str = typer.Option("results", "--results", metavar="DIR", help="Results directory (one Parquet file per run)."),
    limit: Optional[int] = typer.Option(None, help="Use only the first N scenes of every split, to extract and to train (a trial run: its rows are kept apart from full runs)."),
    overwrite: bool = typer.Option(False, help="Re-run rows already present in the results directory."),
    exclude_background: bool = typer.Option(False, help="issameobject: drop patch pairs that involve background."),
    executor: str = typer.Option("local", help="local (in this process) or ray (extraction in row shards and training as Ray tasks)."),
    address: Optional[str] = typer.Option(None, help="--executor ray: the cluster, auto or ray://HOST:PORT [a local Ray on this machine]."),
    gpus_per_task: Optional[float] = typer.Option(None, help="--executor ray: GPUs per task, fractions allowed [1 on CUDA, 0 on CPU]."),
    threads: Optional[int] = typer.Option(None, "--threads", help="Torch threads for extraction and probe training [auto: the usable cores other work leaves free, measured when the work starts, at least 1; Ray tasks run 1]."),
    memory_budget: Optional[str] = typer.Option(None, "--memory-budget", metavar="SIZE", help="Host memory a probe fit may hold of activation rows at once, e.g. 1GiB, 512MiB or bytes; reads in pieces, same numbers [half the available memory]."),
    image_size: Optional[int] = typer.Option(None, help="Input side in px in place of each model's own (Hugging Face models and ModuleAdapter modules, e.g. a save_pretrained folder without preprocessor_config.json)."),
    mean: Optional[str] = typer.Option(None, help="Normalisation mean R,G,B in place of each model's own (as --image-size)."),
    std: Optional[str] = typer.Option(None, help="Normalisation std R,G,B in place of each model's own (as --image-size)."),
    fmt: Format = typer.Option(Format.table, "--format", help="Summary table format."),
    wide: bool = typer.Option(False, "--wide", help="The table with every summary column (default: the headline numbers, 100 columns wide)."),
) -> None:
    """Measure binding (B, β, β*) or IsSameObject accuracy of backbones; write results/<run_id>.parquet."""
    from bench.core.errors import BenchError
    from bench.core.resources import parse_size

    try:
        seed_values = [int(s) for s in _split(seeds)]
    except ValueError:
        raise BenchError(f"seeds: expected integers, got {', '.join(seeds)}") from None
    if probes and not _split(probes):
        raise BenchError("probes: empty; name probe families (see `bench evaluate --help`) or leave --probes out")
    done = api.evaluate_run(
        _split(model), dataset, task=task, layers=layers, tokens=_split(tokens) or None,
        probes=_split(probes) or None, seeds=seed_values, device=device, dtype=dtype, epochs=epochs,
        results=results, overwrite=overwrite, limit=limit, exclude_background=exclude_background,
        unanchored=unanchored, executor=executor, address=address, gpus_per_task=gpus_per_task, control=control,
        command=(ctx.obj or {}).get("command"), threads=threads, image_size=image_size,
        memory_budget=None if memory_budget is None else parse_size(memory_budget, "memory budget"),
        mean=parse_floats(mean, "mean"), std=parse_floats(std, "std"), progress=True,
    )
    if done.skipped:
        stderr.print(f"skipped {done.skipped} row(s) already in {results} (--overwrite re-runs them)", soft_wrap=True)
    if done.path is None:
        if fmt in (Format.json, Format.csv):  # machine-readable output stays parseable: no rows
            echo(render_table([], TASKS.get(task).summary_columns, fmt))
        stderr.print(f"every requested row is already in {results}; nothing to do (use --overwrite to re-run)", soft_wrap=True)
        return
    columns = TASKS.get(task).summary_columns  # `--wide`, CSV and JSON: every summary column
    rows = done.rows
    for row in rows:
        row["checks"] = "; ".join(row["checks"] or ()) or None
    title = f"{task} results · {dataset.name}"
    if fmt in (Format.table, Format.markdown) and not wide:
        shown, names = short_summary(rows, task)
        echo(render_table(shown, names, fmt, title=title, width=TABLE_WIDTH))
    else:
        echo(render_table(rows, columns, fmt, title=title))
    stderr.print(f"wrote {len(rows)} rows to {done.path}", soft_wrap=True)
