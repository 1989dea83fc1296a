"""Training zoo models in a second process while this one evaluates other backbones.

On a small machine the zoo's training and the evaluation of backbones that need none each keep
a core busy; a study (the demo among them) that names zoo models not yet trained starts them
here, evaluates what does not wait for them, then waits.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from bench.core.errors import BenchError


def untrained(specs: Sequence[str]) -> list[str]:
    """The `zoo:NAME` specs among `specs` whose recipe (as written) is not trained yet."""
    from evaluators.zoo import status

    return [s for s in dict.fromkeys(specs) if s.startswith("zoo:") and status(s.split(":", 1)[1])["status"] != "trained"]


@contextlib.contextmanager
def zoo_in_background(specs: Sequence[str], rerun: str) -> Iterator[Callable[[], dict[str, Path]]]:
    """Train the zoo recipes of `specs` (those not trained yet, see `untrained`) in a second
    process; yields a function that waits for them and returns each one's directory. The child
    is stopped if the block fails (its checkpoints let the next run resume); `rerun` names the
    command that resumes it, for the error line. Variants (`bench zoo train --seed/--steps`)
    are not what zoo:NAME names."""
    import multiprocessing

    from evaluators.zoo import get_recipe, zoo_root

    todo = {spec: get_recipe(spec.split(":", 1)[1]) for spec in untrained(specs)}
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
                raise BenchError(f"zoo: training stopped (exit code {child.exitcode}); run `{rerun}` again to "
                                 "resume it") from None
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
    from evaluators.zoo.training import train_recipe

    try:
        for spec, recipe in recipes.items():
            send.send((spec, str(train_recipe(recipe, root)), None))
    except Exception as e:  # the parent reports it in one line
        send.send((None, None, str(e) if isinstance(e, BenchError) else f"zoo: training failed: {type(e).__name__}: {e}"))
