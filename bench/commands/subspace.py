"""`bench subspace`: fit one subspace of a backbone's layer to a `.npz` (the binding subspace or a
control), and `bench subspace angles A B`: the principal-angle cosines between two."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bench import api
from bench.commands.common import echo, stderr
from bench.core.errors import BenchError
from bench.core.intervention_specs import SUBSPACE_KINDS


def register(app: typer.Typer) -> None:
    app.command("subspace")(subspace)


def subspace(
    args: list[str] = typer.Argument(..., metavar="DATASET | angles A B",
                                     help="The dataset to fit on, or `angles` and two subspace files."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Backbone spec (fitting)."),
    layer: Optional[int] = typer.Option(None, help="Hidden state (0 = embeddings) to fit at."),
    kind: str = typer.Option("binding", help=f"One of {', '.join(SUBSPACE_KINDS)} (the first is the binding "
                                             "subspace, the others its controls)."),
    rank: int = typer.Option(16, help="Probe rank (binding, shuffled-labels) or directions (random, feature)."),
    energy: float = typer.Option(0.95, help="Share of the probe form's squared Frobenius norm kept (binding)."),
    seed: int = typer.Option(0, help="Seed of pairs, probe and random directions."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="The .npz to write (default: subspace-KIND-LLAYER.npz)."),
    overwrite: bool = typer.Option(False, help="Replace an existing subspace file at --out."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    limit: Optional[int] = typer.Option(None, help="Use only the first N scenes of each split."),
) -> None:
    """Fit the binding subspace (the IsSameObject quadratic probe's) or a control at one layer and
    write it to a .npz: name it in `intervene:<kind>=<s>,layer=<L>,subspace=<file>:<model>`. With
    `angles A B`, print the cosines of the principal angles between two subspace files."""
    if args[0] == "angles":
        if len(args) != 3:
            raise BenchError("subspace angles: expected two subspace files: bench subspace angles A B")
        echo(" ".join(f"{c:.4f}" for c in api.subspace_angles(args[1], args[2])))
        return
    if len(args) != 1:
        raise BenchError("subspace: expected one dataset (or `angles A B`)")
    if model is None or layer is None:
        raise BenchError("subspace: --model and --layer are required to fit a subspace")
    target = out or Path(f"subspace-{kind}-L{layer}.npz")
    sub = api.write_subspace(args[0], model=model, layer=layer, out=target, overwrite=overwrite, kind=kind, rank=rank,
                             energy=energy, seed=seed, device=device, limit=limit)
    stderr.print(f"{sub.kind} subspace of {sub.backbone} layer {sub.layer}: rank {sub.rank} "
                 f"(fingerprint {sub.fingerprint[:16]}) → {target}")
    echo(str(target))
