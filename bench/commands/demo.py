"""`bench demo`: the whole pipeline offline in a few minutes (train the zoo, generate, evaluate, rank)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

import typer

from bench.commands.common import Format, echo, progress_bar, stderr
from bench.commands.leaderboard import _board

#: The demo's backbones: two oracles (the top and bottom of the scale), a no-learning
#: baseline, an untrained network, and the zoo's learned ViTs (trained here on first use,
#: then reused from the cache); none needs a download.
ZOO_MODELS = ("zoo:conjunctions", "zoo:masked", "zoo:features", "zoo:untrained")
DEMO_MODELS = ("oracle:objects", "oracle:features", "pixels", "random:dinov2-small", *ZOO_MODELS)
DEMO_PROBES = ("linear", "quadratic", "dnn")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)


def demo(
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Keep the dataset and results here (default: a temporary directory, removed)."),
    n_train: int = typer.Option(400, help="Training scenes."),
    n_val: int = typer.Option(100, help="Validation scenes."),
    n_test: int = typer.Option(100, help="Test scenes."),
    image_size: int = typer.Option(128, help="Image side in pixels."),
    epochs: Optional[int] = typer.Option(None, help="Maximum probe epochs (default: the evaluator's; probes stop on the validation plateau)."),
    fmt: Format = typer.Option(Format.table, "--format"),
) -> None:
    """Run the whole pipeline offline in a few minutes: train the zoo, generate, evaluate eight backbones, rank."""
    t0 = time.perf_counter()
    work = out or Path(tempfile.mkdtemp(prefix="bindingbench-demo-"))
    if out is not None:
        from bench.results import check_writable

        check_writable(out, "out")  # now, not after minutes of training
    try:
        data, results = work / "colorshape-demo", work / "results"
        stderr.print("[bold]1/4[/bold] training the zoo's small ViTs (once: reused from the cache afterwards)")
        _demo_zoo()
        stderr.print(f"[bold]2/4[/bold] generating a balanced ColorShape set ({n_train}/{n_val}/{n_test} scenes, {image_size} px)")
        _demo_dataset(data, n_train, n_val, n_test, image_size)
        stderr.print(f"[bold]3/4[/bold] evaluating {', '.join(DEMO_MODELS)} with {', '.join(DEMO_PROBES)} probes")
        _demo_evaluate(data, results, epochs)
        stderr.print("[bold]4/4[/bold] leaderboard")
        from leaderboards.tables import build_leaderboard, render_leaderboards

        rows, board = _board(results, layer="last")
        boards = [board]
        if fmt in (Format.table, Format.markdown):  # the same runs under the published estimator, to compare
            paper = build_leaderboard(rows, layer="last", metric="beta_star_paper")
            boards += [paper] if paper.has_values else []
        echo(render_leaderboards(boards, fmt))
    finally:
        if out is None:
            shutil.rmtree(work, ignore_errors=True)
    if fmt in (Format.table, Format.markdown):
        echo(
            "\nβ* = 1 − L_O|F / H(O|F): every probe starts at the generator's exact prior, so a backbone with "
            "nothing beyond the prior reads 0 (below 0 only by test noise) and none reads above 100%. "
            "oracle:objects hands the probes the object code itself and reads near 100%; oracle:features hands "
            "them only the features and reads 0. "
            "zoo:* are small ViTs trained here on other scenes (`bench zoo list`): conjunctions was trained to "
            "report which colour-shape pairs are present (binding needed), features only which colours and shapes "
            "(not needed), masked to fill in hidden patches; untrained is the same network before training. "
            "β*_paper (the second table) is the published estimator, a difference of two probes that learn the "
            "prior themselves, shown for comparison with published numbers: on a few hundred scenes it often falls "
            "outside [0, 100%], and a cell is marked ‡ and not ranked where its probes fail a check. "
            "To measure a real model, run `bench evaluate --model facebook/dinov2-small --dataset DATA_DIR` on a "
            "dataset made by `bench generate`, then `bench leaderboard results/` "
            "(`--metric beta_star_paper` for the published estimator)."
        )
    kept = f"; dataset and results kept in {out}" if out else " (pass --out DIR to keep the dataset and results)"
    stderr.print(f"demo finished in {time.perf_counter() - t0:.0f} s{kept}")


def _demo_zoo() -> None:
    """Train whichever zoo models are not in the cache yet (each about a CPU-minute); a finished
    model is used as it is, even one the user trained longer or with another seed."""
    from bench.commands.zoo import train_one
    from evaluators.zoo import status

    for spec in ZOO_MODELS:
        name = spec.split(":", 1)[1]
        if status(name)["status"] != "trained":
            train_one(name)


def _demo_dataset(target: Path, n_train: int, n_val: int, n_test: int, image_size: int) -> None:
    from generators.base import build_config, get_generator
    from generators.engine import generate

    gen = get_generator("colorshape")
    config = build_config(gen, "small", dict(n_train=n_train, n_val=n_val, n_test=n_test, image_size=image_size))
    with progress_bar("generate") as bar:
        generate(gen, config, target, progress=bar.advance, on_start=bar.set_total)


def _demo_evaluate(data: Path, results: Path, epochs: int | None) -> None:
    """Evaluate the demo backbones with the evaluator's defaults. Activations are cached beside the
    results (unless $BINDINGBENCH_CACHE is set), so a demo leaves only the zoo in the user's cache."""
    import torch

    from evaluators.run import run_evaluation
    from evaluators.zoo import ZOO_ENV, zoo_root

    threads = torch.get_num_threads()
    pinned = {ZOO_ENV: str(zoo_root()),  # the zoo stays where step 1 trained it
              "BINDINGBENCH_CACHE": os.environ.get("BINDINGBENCH_CACHE") or str(results.parent / "cache")}
    # The demo's probes are tiny: one thread beat two by 5x on a busy 2-core CPU (thread sync dominates).
    torch.set_num_threads(1)
    try:
        with _environ(pinned):
            run_evaluation(list(DEMO_MODELS), data, task="binding", layers="last", tokens=("cls",),
                           probes=DEMO_PROBES, results_dir=results, epochs=epochs, progress=True)
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the block, then restore (or remove) them."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
