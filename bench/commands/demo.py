"""`bench demo`: the whole pipeline offline in a few minutes (train the zoo, generate, evaluate, rank).

The dataset is the zoo's own kind of scene (`colorshape --preset zoo` at the zoo's image and
object size, evaluators/zoo/recipes.py) with another seed, so the learned backbones are scored on
what they learned to see: two objects, two colours, two shapes, one bit of binding per scene. On
the paper's 18-object scenes every zoo model reads 0 at any size the demo can afford.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import typer

from bench.commands.common import Format, echo, progress_bar, stderr
from bench.core.errors import BenchError

#: The demo's backbones: three oracles (the top, the middle and the bottom of the scale), a
#: no-learning baseline, and the zoo's ViTs, learned (trained here on first use, then reused from
#: the cache) and untrained; none needs a download. random:dinov2-small is not among them: at its
#: native 224 px its extraction and probes took 250 of the demo's 580 CPU-seconds on these 1,400
#: scenes, and zoo:untrained is the untrained network already.
ZOO_MODELS = ("zoo:conjunctions", "zoo:masked", "zoo:features", "zoo:untrained")
DEMO_MODELS = ("oracle:objects", "oracle:mix-0.5", "oracle:features", "pixels", *ZOO_MODELS)
DEMO_PROBES = ("linear", "quadratic", "dnn")
#: One control null: the backbone that binds most among the learned ones, its O redrawn from the
#: exact p(O|F) independently of the image, so its true β* is 0 whatever the backbone carries.
CONTROL, CONTROL_MODEL = "resampled-o", "zoo:conjunctions"
#: The dataset's seed: the zoo renders its own scenes from seed 0, the demo scores it on others.
DEMO_SEED = 1
#: Without --out the demo writes here, in the working directory (the project's .gitignore lists
#: it): `bench-demo`, else `bench-demo-2`, `-3`, …; a folder is reused when its manifest says an
#: earlier demo made it with the same sizes, and nothing in it is ever deleted.
DEMO_DIR = "bench-demo"
DEMO_MANIFEST = "bench-demo.json"


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)


def demo(
    out: Optional[Path] = typer.Option(None, "--out", "-o", help=f"Write the dataset, results and activation cache here (default: ./{DEMO_DIR}, or a numbered one beside it; kept, and reused by a demo of the same sizes)."),
    n_train: int = typer.Option(800, help="Training scenes."),
    n_val: int = typer.Option(200, help="Validation scenes."),
    n_test: int = typer.Option(400, help="Test scenes."),
    image_size: Optional[int] = typer.Option(None, help="Image side in pixels (default: the zoo's, 64)."),
    epochs: Optional[int] = typer.Option(None, help="Maximum probe epochs (default: the evaluator's; probes stop on the validation plateau)."),
    fmt: Format = typer.Option(Format.table, "--format"),
) -> None:
    """Run the whole pipeline offline in minutes: train the zoo, generate, evaluate eight backbones and a control null, rank."""
    t0 = time.perf_counter()
    for name, n in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
        if n < 1:  # probes need all three splits: refused now, not after the zoo has trained
            raise BenchError(f"{name}: must be ≥ 1, got {n}")
    if image_size is not None and image_size < 1:  # checked before the slow imports below
        raise BenchError(f"image_size: must be > 0, got {image_size}")
    if epochs is not None and epochs < 1:
        raise BenchError(f"epochs: must be ≥ 1, got {epochs}")
    from bench.api import SCENES

    side = SCENES["image_size"] if image_size is None else image_size
    gen, config = _demo_config(n_train, n_val, n_test, side)
    gen(config)  # a bad size is refused here, before a folder is chosen or made
    settings = {"n_train": n_train, "n_val": n_val, "n_test": n_test, "image_size": side, "seed": DEMO_SEED}
    work = out if out is not None else demo_folder(Path(), settings)
    from bench.core.results import check_writable

    check_writable(work, "out")  # now, not after minutes of training
    _write_manifest(work, settings)
    data, results = work / "colorshape-demo", work / "results"
    from bench.api import render_leaderboards

    stderr.print(f"[bold]1/4[/bold] generating the zoo's kind of ColorShape scenes ({n_train}/{n_val}/{n_test}, "
                 f"{side} px) in {data}")
    _demo_dataset(data, gen, config)
    others = [m for m in DEMO_MODELS if m not in ZOO_MODELS]
    with _zoo_in_background() as zoo_trained:
        stderr.print(f"[bold]2/4[/bold] training the zoo's small ViTs in a second process (once: reused from the "
                     f"cache afterwards) while evaluating {', '.join(others)} with {', '.join(DEMO_PROBES)} probes")
        with _evaluation_settings(results):
            _evaluate(others, data, results, epochs)
            for spec, path in zoo_trained().items():
                stderr.print(f"{spec} → {path}")
            stderr.print(f"[bold]3/4[/bold] evaluating {', '.join(ZOO_MODELS)}, and the {CONTROL} control on "
                         f"{CONTROL_MODEL}")
            _evaluate(ZOO_MODELS, data, results, epochs)
            _evaluate((CONTROL_MODEL,), data, results, epochs, control=CONTROL)
    stderr.print("[bold]4/4[/bold] leaderboard")
    echo(render_leaderboards(_demo_boards(results, fmt), fmt))
    if fmt in (Format.table, Format.markdown):
        echo(
            "\nβ* = 1 − L_O|F / H(O|F): every probe starts at the generator's exact prior, so a backbone with "
            "nothing beyond the prior reads 0 (below 0 only by test noise) and none reads above 100%. "
            "oracle:objects hands the probes the object code itself and reads near 100%; oracle:mix-0.5 hands it "
            "over for half the scenes (a true β* of about 50%, which a probe trained on a few hundred scenes "
            "recovers only in part); oracle:features hands them only the features and reads 0. "
            "zoo:* are small ViTs trained here on scenes like these but not these (`bench zoo list`): conjunctions "
            "was trained to report which colour-shape pairs are present (binding needed), features only which "
            "colours and shapes (not needed), masked to fill in hidden patches; untrained is the same network "
            "before training. The control row scores zoo:conjunctions against objects redrawn from p(O|F), "
            "independent of the image (its row, marked control, is never ranked): it must read 0. Ranks come from "
            "paired differences on the same test scenes; s beside a 0 is the probe's sensitivity here, the share of "
            "a planted binding of known size it recovers. "
            "β*_paper (the last table) is the published estimator, a difference of two probes that learn the "
            "prior themselves, shown for comparison with published numbers: on a few hundred scenes it often falls "
            "outside [0, 100%], and a cell is marked ‡ and not ranked where its probes fail a check. "
            "To measure a real model, run `bench evaluate --model facebook/dinov2-small --dataset DATA_DIR` on a "
            "dataset made by `bench generate`, then `bench leaderboard results/` "
            "(`--metric beta_star_paper` for the published estimator)."
        )
    stderr.print(f"demo finished in {time.perf_counter() - t0:.0f} s; its dataset, results and activation cache are "
                 f"in {work}/ (kept; a demo of the same sizes there reuses them). Next:", soft_wrap=True)
    for command in next_commands(work):
        stderr.print(f"  {command}", soft_wrap=True, markup=False, highlight=False)


def next_commands(work: Path) -> list[str]:
    """The three commands a user runs after the demo: the board again, the report, a real model."""
    d = _shell_path(work)
    return [f"bench leaderboard {d}/results --metric beta_O",
            f"bench report {d}/results -o {d}/report.html",
            f"bench evaluate --model random:dinov2-small --dataset {d}/colorshape-demo --results {d}/results "
            "--layers 0,6,12 --tokens cls --probes linear"]


def _shell_path(path: Path) -> str:
    """`path` relative to the working directory when it lies inside it, quoted for a shell when needed."""
    import shlex

    try:
        shown = str(Path(path).resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        shown = str(path)
    return shlex.quote(shown)


def demo_folder(parent: Path, settings: dict[str, Any]) -> Path:
    """The default output folder in `parent`: the first of bench-demo, bench-demo-2, … that is
    free, or that an earlier demo made with the same `settings` (its manifest says so)."""
    for k in range(1, 10_000):
        folder = parent / (DEMO_DIR if k == 1 else f"{DEMO_DIR}-{k}")
        if not folder.exists() and not folder.is_symlink():
            return folder
        if folder.is_dir() and not folder.is_symlink() and _read_manifest(folder) == settings:
            return folder
    raise BenchError(f"out: {parent} already holds {DEMO_DIR} … {DEMO_DIR}-9999; pass --out DIR")


def _read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((folder / DEMO_MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return manifest.get("settings") if isinstance(manifest, dict) else None


def _write_manifest(folder: Path, settings: dict[str, Any]) -> None:
    """Record what made the folder (so a later demo of the same sizes reuses it), unless it says so already."""
    if not (folder / DEMO_MANIFEST).exists():
        import bench
        from bench.core.dataset import write_json_atomic

        write_json_atomic({"made_by": "bench demo", "bench_version": bench.__version__, "settings": settings},
                          folder / DEMO_MANIFEST)


@contextlib.contextmanager
def _zoo_in_background() -> Iterator[Callable[[], dict[str, Path]]]:
    """Train the zoo recipes (as written) that are not in the cache yet in a second process, so that
    the two cores of a small machine train and evaluate at once; yields a function that waits for
    them and returns each one's directory. The child is stopped if the block fails (its checkpoints
    let the next run resume). Variants (`bench zoo train --seed/--steps`) are not what zoo:NAME names."""
    import multiprocessing

    from bench.api import get_recipe, status, zoo_root

    todo = {spec: get_recipe(spec.split(":", 1)[1]) for spec in ZOO_MODELS
            if status(spec.split(":", 1)[1])["status"] != "trained"}
    if not todo:
        yield lambda: {}
        return
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch thread pools
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_train_zoo, args=(todo, zoo_root(), send), daemon=True)
    child.start()
    send.close()

    def wait() -> dict[str, Path]:
        done = {}
        while len(done) < len(todo):
            try:
                spec, path, error = receive.recv()
            except EOFError:
                child.join()
                raise BenchError(f"zoo: training stopped (exit code {child.exitcode}); "
                                 f"run `bench demo` again to resume it") from None
            if error is not None:
                raise BenchError(error)
            done[spec] = Path(path)
        return done

    try:
        yield wait
    finally:
        if child.is_alive():
            child.terminate()
        child.join()


def _train_zoo(recipes: dict[str, Any], root: Path, send: Any) -> None:
    """In the child: train each recipe in turn, sending (spec, directory, None), or (None, None, the
    error's one line) and stop."""
    from bench.api import train_recipe

    try:
        for spec, recipe in recipes.items():
            send.send((spec, str(train_recipe(recipe, root)), None))
    except Exception as e:  # the parent reports it in one line
        send.send((None, None, str(e) if isinstance(e, BenchError) else f"zoo: training failed: {type(e).__name__}: {e}"))


def _demo_config(n_train: int, n_val: int, n_test: int, image_size: int) -> tuple[Any, Any]:
    """The generator and config of the demo's scenes."""
    from bench.api import DATA_PRESET, SCENES, build_config, get_generator

    gen = get_generator("colorshape")
    return gen, build_config(gen, DATA_PRESET, dict(SCENES, n_train=n_train, n_val=n_val, n_test=n_test,
                                                    image_size=image_size, seed=DEMO_SEED))


def _demo_dataset(target: Path, gen: Any, config: Any) -> None:
    """Generate the demo's scenes into `target`, or reuse them when an earlier demo made the same there."""
    from bench.core.dataset import CARD_NAME, Dataset
    from bench.api import config_to_dict, render_dataset as generate

    if (target / CARD_NAME).exists():
        card = Dataset(target).card
        if card.get("generator", {}).get("name") == gen.name and card.get("config") == json.loads(json.dumps(config_to_dict(config))):
            stderr.print(f"reusing the scenes in {target} (the same sizes and seed)", soft_wrap=True)
            return
        raise BenchError(f"out: {target} holds a dataset made with other settings; choose another --out "
                         "(the demo never replaces what it did not make in this run)")
    with progress_bar("generate") as bar:
        generate(gen, config, target, progress=bar.advance, on_start=bar.set_total)


@contextlib.contextmanager
def _evaluation_settings(results: Path) -> Iterator[None]:
    """One torch thread (the other core trains the zoo; and the demo's probes are tiny: one thread beat
    two by 5x on a busy 2-core CPU) and activations cached beside the results (unless
    $BINDINGBENCH_CACHE is set), so a demo leaves only the zoo in the user's cache."""
    import torch

    from bench.api import ZOO_ENV, zoo_root

    threads = torch.get_num_threads()
    pinned = {ZOO_ENV: str(zoo_root()),  # the zoo stays where it is trained
              "BINDINGBENCH_CACHE": os.environ.get("BINDINGBENCH_CACHE") or str(results.parent / "cache")}
    torch.set_num_threads(1)
    try:
        with _environ(pinned):
            yield
    finally:
        torch.set_num_threads(threads)


def _evaluate(models: Sequence[str], data: Path, results: Path, epochs: int | None, control: str | None = None) -> None:
    """The evaluator with its defaults, on `cls` at the last layer."""
    from bench.api import EvaluationPlan, run_evaluation

    run_evaluation(EvaluationPlan(list(models), data, task="binding", layers="last", tokens=("cls",),
                                  probes=DEMO_PROBES, results_dir=results, epochs=epochs, control=control))


def _demo_boards(results: Path, fmt: Format) -> list[Any]:
    """β* of the backbones, ranked by paired differences (the control's row shown apart, unranked);
    for tables, β*_paper of the same runs to compare."""
    from bench.api import build_leaderboard, load_selected

    selected = load_selected(results)
    if selected.note:
        stderr.print(selected.note, soft_wrap=True, markup=False, highlight=False)
    boards = [build_leaderboard(selected.rows, layer="last")]
    if fmt in (Format.table, Format.markdown):  # the same runs under the published estimator, to compare
        paper = build_leaderboard([r for r in selected.rows if r.get("control") is None], layer="last",
                                  metric="beta_star_paper")
        boards += [paper] if paper.has_values else []
    return boards


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
