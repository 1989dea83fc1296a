"""Backbone commands: `bench models`, `bench extract`, `bench cache ls|rm`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bench import api
from bench.core.errors import BenchError
from bench.commands.common import Format, echo, parse_floats, render_table, stderr

cache_app = typer.Typer(help="See and clear cached activations.")

CACHE_COLUMNS = ["key", "status", "backbone", "dataset", "fingerprint", "split", "side", "layers", "tokens", "rows",
                 "size_mb"]


def register(app: typer.Typer) -> None:
    app.command("models")(models)
    app.command("extract")(extract)
    app.add_typer(cache_app, name="cache")


def models(
    spec: Optional[str] = typer.Argument(None, help="Show one backbone (resolved, so hub ids must be cached)."),
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="Output format."),
    image_size: Optional[int] = typer.Option(None, help="With a spec: its native input side in px, in place of its own."),
    mean: Optional[str] = typer.Option(None, help="With a spec: normalisation mean R,G,B in place of its own."),
    std: Optional[str] = typer.Option(None, help="With a spec: normalisation std R,G,B in place of its own."),
) -> None:
    """List the registered backbones: every backbone source's (presets, random-init controls, pixels, oracles, zoo,
    plugins'), or one spec resolved, with where its weights come from."""
    listing = api.models(spec, image_size=image_size, mean=parse_floats(mean, "mean"), std=parse_floats(std, "std"))
    rows = listing.rows
    if fmt == Format.json:
        echo(render_table(rows, list(rows[0]), fmt))
        return
    short = [{"spec": r["spec"], "source": r["source"], "revision": r["revision"][:19],
              "params_M": round(r["n_params"] / 1e6, 1), "input": r["input_size"], "patch": r["patch_size"],
              "L": r["n_layers"], "D": r["width"] or "data", "pre": r["n_prefix"]} for r in rows]
    forms = "; ".join(f"{name}: {text}" for name, text in listing.forms.items())
    echo(render_table(short, list(short[0]), fmt, title=f"Backbones (spec forms by source: {forms})"))


def extract(
    model: str = typer.Option(..., "--model", "-m", help="Backbone spec (see `bench models`)."),
    dataset: Path = typer.Option(..., "--dataset", "-d", help="Dataset directory."),
    split: list[str] = typer.Option(["train", "val", "test"], "--split", help="Splits (repeatable)."),
    layers: str = typer.Option("all", help="all, last, mid, indices or fractions, comma-separated."),
    tokens: str = typer.Option("cls", help="Views to store: cls, mean, all, cls+mean (comma-separated)."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    dtype: str = typer.Option("fp32", help="fp32, bf16 or fp16 (autocast)."),
    batch_size: int = typer.Option(32, help="Images per forward pass."),
    resolution: str = typer.Option("native", help="native or match-grid."),
    image_size: Optional[int] = typer.Option(None, help="Input side in px (overrides native)."),
    cache_dir: Optional[str] = typer.Option(None, metavar="DIR", help="Cache root (default $BINDINGBENCH_CACHE or ~/.cache/bindingbench)."),
    limit: Optional[int] = typer.Option(None, help="Only the first N scenes of each split (as `bench evaluate --limit`)."),
    also: list[str] = typer.Option([], "--also", metavar="LAYERS:TOKENS",
                                   help="Another selection from the same forward pass, e.g. last:all (repeatable)."),
) -> None:
    """Extract and cache activations (evaluate does this on demand; this pre-fills the cache)."""
    for s, acts in api.extract(model, dataset, splits=split, layers=layers, token_choices=tokens.split(","),
                               device=device, dtype=dtype, batch_size=batch_size, resolution=resolution,
                               image_size=image_size, cache_dir=cache_dir, limit=limit,
                               also=[_selection(a) for a in also]):
        echo(f"{s}: {acts.n} rows, layers {acts.layers[0]}..{acts.layers[-1]}, "
             f"tokens {','.join(acts.token_choices)} -> {acts.path}")


def _selection(text: str) -> tuple[str, list[str]]:
    """`--also LAYERS:TOKENS` as (layers, tokens choices); a malformed one is one line."""
    layers, sep, tokens = text.partition(":")
    if not sep or not layers.strip() or not tokens.strip():
        raise BenchError(f"also: {text!r} is not LAYERS:TOKENS (e.g. last:all or 0,6,12:cls,mean)")
    return layers.strip(), [t.strip() for t in tokens.split(",")]


@cache_app.callback(invoke_without_command=True)
def cache_group(ctx: typer.Context) -> None:
    """See and clear cached activations."""
    if ctx.invoked_subcommand is None:
        echo(ctx.get_help())


@cache_app.command("ls")
def cache_ls(
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="Output format."),
    cache_dir: Optional[Path] = typer.Option(None, help="Cache root (default $BINDINGBENCH_CACHE or ~/.cache/bindingbench)."),
) -> None:
    """List cached activation entries (partial ones are resumable)."""
    rows = api.cache_entries(cache_dir)
    columns = CACHE_COLUMNS if fmt != Format.json else [*CACHE_COLUMNS, "revision", "path"]
    echo(render_table(rows, columns, fmt, title="Activation cache"))


@cache_app.command("rm")
def cache_rm(
    keys: list[str] = typer.Argument(None, help="Entry keys or key prefixes (see `bench cache ls`)."),
    all_: bool = typer.Option(False, "--all", help="Remove every entry."),
    partial: bool = typer.Option(False, "--partial", help="Remove unfinished entries only."),
    cache_dir: Optional[str] = typer.Option(None, metavar="DIR", help="Cache root (default $BINDINGBENCH_CACHE or ~/.cache/bindingbench)."),
) -> None:
    """Remove cached activation entries."""
    removed, freed = api.remove_cache_entries(keys or (), every=all_, partial=partial, cache_dir=cache_dir)
    stderr.print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} ({freed / 2**20:.1f} MiB)")
