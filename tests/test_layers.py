"""One-way layers: `bench.core` at the bottom; `generators`, `evaluators` and `leaderboards` above
it, with `bench.studies` (study files, run through them); `bench.api` above those; the CLI
(`bench.cli`, `bench.commands`) and the `benchmarks/` scripts on top. A module imports only from
its own layer or below, and there is no import cycle anywhere; the commands read everything below
the API through it (only `bench.api` and `bench.core`).

The graph is read from source with `ast`, imports inside functions included (a lazy import
is still a dependency), and the check is shown to catch planted violations."""

from __future__ import annotations

import ast
import shutil
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bench", "generators", "evaluators", "leaderboards", "benchmarks")
CLI = ("bench.cli", "bench.commands")


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its file (function bodies too)."""
    files = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    found.add(t)
        graph[name] = found
    return graph


def layer(module: str) -> int:
    """0 core, 1 generators/evaluators/leaderboards and the studies over them, 2 the API, 3 the CLI
    and the benchmarks."""
    if module == "bench" or module.startswith("bench.core"):
        return 0
    if module.split(".")[0] in ("generators", "evaluators", "leaderboards") or module.startswith("bench.studies"):
        return 1
    if module == "bench.api":
        return 2
    return 3  # bench.cli, bench.commands, benchmarks


def skips_the_api(module: str, target: str) -> bool:
    """A command that reads a layer below the API other than `bench.core` directly."""
    if not module.startswith("bench.commands"):
        return False
    return not (target in ("bench", "bench.api") or target.startswith(("bench.core", "bench.commands")))


def violations(graph: dict[str, set[str]]) -> list[str]:
    """`A imports B` for every import that runs up the layers or past the API, and any import cycle."""
    out = [f"{m} imports {t}" for m, ts in sorted(graph.items()) for t in sorted(ts)
           if layer(t) > layer(m) or skips_the_api(m, t)]
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as e:
        out.append("import cycle: " + " -> ".join(e.args[1]))
    return out


def test_the_layers_run_one_way():
    assert violations(import_graph(ROOT)) == []


@pytest.mark.parametrize("planted, expected", [
    ({"evaluators/planted.py": "def f():\n    from bench.commands.common import stderr\n"},
     "evaluators.planted imports bench.commands.common"),
    ({"bench/core/planted.py": "import evaluators.runner.run\n"}, "bench.core.planted imports evaluators.runner.run"),
    ({"leaderboards/planted.py": "def f():\n    from bench import api\n"}, "leaderboards.planted imports bench.api"),
    ({"bench/commands/planted.py": "def f():\n    from evaluators.runner.run import run_evaluation\n"},
     "bench.commands.planted imports evaluators.runner.run"),
    ({"evaluators/planted.py": "from benchmarks import probes\n"}, "evaluators.planted imports benchmarks.probes"),
    ({"generators/planted_a.py": "def f():\n    from generators import planted_b\n",
      "generators/planted_b.py": "import generators.planted_a\n"}, "import cycle: generators.planted_"),
])
def test_a_planted_violation_is_caught(tmp_path, planted, expected):
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for name, text in planted.items():  # an import inside a function body counts too
        (tmp_path / name).write_text(text)
    assert [v for v in violations(import_graph(tmp_path)) if v.startswith(expected)]
