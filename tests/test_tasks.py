"""Tasks are registered objects (bench/core/tasks.py): no code outside the task registry and a
task's own package names a built-in task, so a new task needs no edit elsewhere. Read with `ast`
(string constants, not text: a comment or a longer string that mentions a task is no branch), and
shown to catch a planted violation."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

from bench.core.tasks import TASKS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bench", "evaluators", "leaderboards", "benchmarks")
#: Words that name a task and, in these places, something else: a zoo recipe's (and card's) `objective`
#: field, what its model was trained for, which the `objective` task is named after; the `binding`
#: subspace kind of an intervention (the subspace the binding probe reads).
NAMESAKES = {"objective": ("evaluators/zoo/", "bench/commands/zoo.py"),
             "binding": ("evaluators/interventions/", "bench/core/intervention_specs.py", "bench/commands/subspace.py")}


def task_literals(root: Path, names: tuple[str, ...]) -> list[str]:
    """`path:line 'name'` for every string constant equal to a task's name outside the registry
    module and that task's own package (`evaluators/tasks/<name>/`)."""
    out = []
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            rel = f.relative_to(root).as_posix()
            if rel == "bench/core/tasks.py":
                continue
            for node in ast.walk(ast.parse(f.read_text(), rel)):
                if (isinstance(node, ast.Constant) and node.value in names
                        and not rel.startswith((f"evaluators/tasks/{node.value}/", *NAMESAKES.get(node.value, ())))):
                    out.append(f"{rel}:{node.lineno} {node.value!r}")
    return out


def test_no_code_outside_the_registry_and_its_package_names_a_built_in_task():
    names = TASKS.names()
    assert names[:2] == ("binding", "issameobject")
    assert task_literals(ROOT, names) == []


def test_the_check_catches_a_planted_task_name(tmp_path):
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "data", "templates"))
    (tmp_path / "leaderboards" / "planted.py").write_text('def f(task):\n    return task == "issameobject"\n')
    (tmp_path / "evaluators" / "tasks" / "binding" / "planted.py").write_text('X = "issameobject"\nY = "binding"\n')
    assert task_literals(tmp_path, TASKS.names()) == ["evaluators/tasks/binding/planted.py:1 'issameobject'",
                                                      "leaderboards/planted.py:2 'issameobject'"]


def test_rows_of_a_task_no_longer_registered_are_set_aside_in_one_phrase(tmp_path):
    """The store the leaderboard, the report (`load_selected`) and the site (`load_folders`) read:
    rows of a task no registry entry names (a plugin since uninstalled) are left out, said once."""
    from bench.core.results import provenance, write_run
    from leaderboards.store import load_folders, load_selected

    row = {**provenance("r1", "cpu"), "backbone": "pixels", "spec": "pixels", "dataset": "d",
           "dataset_fingerprint": "f" * 16, "split": "test", "layer": 0, "n_layers": 0, "tokens": "mean",
           "probe": "median-norm", "seed": 0, "status": "ok", "weights_fingerprint": "w", "probe_fingerprint": "p"}
    write_run([{**row, "task": "norm", "majority_accuracy": 0.5}, {**row, "task": "binding", "beta_star": 0.1}],
              tmp_path, "r1")
    for selection in (load_selected(tmp_path), load_folders([tmp_path])):
        assert [r["task"] for r in selection.rows] == ["binding"]
        assert selection.note == ("set aside: 1 rows of task norm, which no installed task registers "
                                  "(registered: binding, issameobject, objective, segmentation)")


def test_the_hooks_a_run_plans_with_import_no_torch():
    """What a run with nothing to do calls before it knows a row is owed — every built-in task's request
    check, probe-fingerprint fields, per-layer probes and a study's dataset check — lives in modules
    without torch (a backbone's own checks run only once it is loaded)."""
    import json
    import subprocess
    import sys

    code = ("import json, sys\nfrom bench.core.tasks import BUILTIN_TASKS, TASKS\n"
            "hooks = {n: [h for h in ('check', 'request', 'layer_probes', 'check_dataset') if TASKS.get(n).hook(h)]"
            " for n in BUILTIN_TASKS}\n"
            "print(json.dumps([hooks, [m for m in ('torch', 'transformers') if m in sys.modules]]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    hooks, loaded = json.loads(done.stdout)
    assert hooks == {"binding": ["check", "request", "check_dataset"], "issameobject": ["request", "layer_probes"],
                     "objective": ["check"], "segmentation": ["request"]}
    assert loaded == []
