"""Dataset commands: `bench generate`, `bench generators`, `bench info`, `bench preview`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from bench import api
from bench.commands.common import TABLE_WIDTH, Format, echo, render_table, stderr
from bench.core.dataset import Dataset
from bench.core.errors import BenchError


def register(app: typer.Typer) -> None:
    app.command("generate")(generate)
    app.command("generators")(generators_cmd)
    app.command("info")(info)
    app.command("preview")(preview)


def _parse_sets(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise BenchError(f"set: expected KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip().replace("-", "_")] = v.strip()
    return out


def generate(
    generator: str = typer.Argument(..., help="Generator name (see `bench generators`)."),
    out: str = typer.Option(..., "--out", "-o", metavar="DIR", help="Output dataset directory."),
    preset: Optional[str] = typer.Option(None, "--preset", "-p", help="Preset (default: the generator's own)."),
    n_train: Optional[int] = typer.Option(None, help="Training scenes."),
    n_val: Optional[int] = typer.Option(None, help="Validation scenes."),
    n_test: Optional[int] = typer.Option(None, help="Test scenes."),
    seed: Optional[int] = typer.Option(None, help="Global seed: same config + seed gives the same bytes."),
    image_size: Optional[int] = typer.Option(None, help="Image side in pixels."),
    workers: int = typer.Option(os.cpu_count() or 1, help="Worker processes (output is identical for any count)."),
    camera_heights: Optional[str] = typer.Option(
        None, help="3D generators: one dataset per camera height, same layouts (e.g. 0.6,1.2,1.9,2.5,3.2)."),
    set_: list[str] = typer.Option([], "--set", help="Any config parameter, KEY=VALUE (repeatable)."),
    overwrite: bool = typer.Option(False, help="Replace an existing dataset."),
    executor: str = typer.Option("local", help="local (worker processes) or ray (one Ray task per shard; same bytes)."),
    address: Optional[str] = typer.Option(None, help="--executor ray: the cluster, auto or ray://HOST:PORT [a local Ray on this machine]."),
) -> None:
    """Render a synthetic dataset with exact codes, masks and analytic priors."""
    overrides = _parse_sets(set_ + ([f"camera_heights={camera_heights}"] if camera_heights is not None else []))
    api.generate(generator, out=out, preset=preset, n_train=n_train, n_val=n_val, n_test=n_test, seed=seed,
                 image_size=image_size, workers=workers, overrides=overrides, overwrite=overwrite, executor=executor,
                 address=address, progress=True)


def generators_cmd(
    fmt: Format = typer.Option(Format.table, "--format"),
    wide: bool = typer.Option(
        False, "--wide", help="Tables as wide as their cells need (default: 100 columns, cells wrapped)."),
) -> None:
    """List generators and their presets: a table per generator, its version and description in the title."""
    found = api.generators()
    rows = [{"generator": g.name, "preset": preset, "default": preset == g.default_preset, "version": g.version,
             "description": g.description, "settings": ", ".join(f"{k}={v}" for k, v in values.items())}
            for g in found for preset, values in g.presets.items()]
    if fmt in (Format.json, Format.csv):
        echo(render_table(rows, ["generator", "preset", "default", "version", "settings", "description"], fmt))
        return
    tables = []  # what a generator's presets share, said once above them (on every line it made 894 columns)
    for g in found:
        tables.append(render_table([r for r in rows if r["generator"] == g.name], ["preset", "default", "settings"],
                                   fmt, title=f"{g.name} v{g.version}: {g.description}",
                                   width=None if wide else TABLE_WIDTH))
    echo("\n\n".join(tables))


def info(
    path: Path = typer.Argument(..., help="Dataset directory."),
    fmt: Format = typer.Option(Format.table, "--format"),
) -> None:
    """Show a dataset's card and its per-split priors (bits)."""
    ds = Dataset(path)
    ds.verify()
    if fmt == Format.json:
        echo(json.dumps(ds.card, indent=2, sort_keys=True))
        return
    card = ds.card
    space = " x ".join(f"{len(g['values'])} {g['name']}" for g in card["feature_space"]["groups"])
    rows = [{"split": s, **card["splits"][s]} for s in ds.splits]
    cols = ["split", "n", "n_F_codes", "n_F_eff", "H_O", "H_F", "H_O_given_F", "max_F_mass"]
    # the generator's own per-split statistics (e.g. 3D scenes' occlusion), after the priors
    cols += sorted({k for r in rows for k, v in r.items() if k not in cols and isinstance(v, (int, float))})
    cols.append("fingerprint")
    for r in rows:
        r["fingerprint"] = r["fingerprint"][:12]
    title = f"{path} — {card['generator']['name']} v{card['generator']['version']}, {space}, seed {card.get('seed')}"
    echo(render_table(rows, cols, fmt, title=title))


def preview(
    path: Path = typer.Argument(..., help="Dataset directory."),
    out: str = typer.Option(..., "--out", "-o", metavar="FILE", help="PNG file to write."),
    split: str = typer.Option("test", help="Split to show."),
    n: int = typer.Option(16, help="Number of scenes."),
) -> None:
    """Write a contact sheet: scenes beside their instance masks, captioned with objects."""
    png = api.preview(path, out, split=split, n=n)
    stderr.print(f"wrote {png}")
