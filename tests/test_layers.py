"""One-way layers: `bench.core` at the bottom; `generators`, `evaluators` and `leaderboards` above
it, with `bench.studies` (study files, run through them); `bench.api` above those; the CLI
(`bench.cli`, `bench.commands`) and the `benchmarks/` scripts on top. A module imports only from
its own layer or below, and there is no import cycle anywhere; the commands read everything below
the API through it (only `bench.api` and `bench.core`), and of the API only the names of its
`__all__`: real functions, so a reader (or an IDE) follows a command into the library.

The graph is read from source with `ast`, imports inside functions included (a lazy import
is still a dependency), and the check is shown to catch planted violations."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
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
    if module == "bench.api" or module.startswith("bench.api."):
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


#: What a command may import besides `bench.api` and `bench.core`: the standard library, the CLI's
#: own libraries, and the other commands.
CLI_LIBRARIES = ("typer", "rich", "click")


def api_names(root: Path) -> set[str]:
    """The names of `bench.api.__all__`, read from its source."""
    tree = ast.parse((root / "bench" / "api" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("bench/api/__init__.py defines no __all__")


def front_door_violations(root: Path) -> list[str]:
    """`file: what` for every import of a command (bench/commands/*.py, function bodies too) that is
    neither `bench.api`, `bench.core.*`, another command, the standard library nor typer/rich/click,
    and for every name it reads of the API (`from bench.api import X`, `api.X`) that is not in
    `bench.api.__all__`."""
    public = api_names(root)
    out = []
    for path in sorted((root / "bench" / "commands").glob("*.py")):
        where = path.relative_to(root).as_posix()
        aliases = set()  # local names bound to the bench.api module
        for node in ast.walk(ast.parse(path.read_text(), where)):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == "bench.api" and a.asname:
                        aliases.add(a.asname)
                    elif not _allowed(a.name):
                        out.append(f"{where}: import {a.name}")
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    module = ".".join(["bench", "commands"][: 3 - node.level] + ([module] if module else []))
                for a in node.names:
                    if module == "bench" and a.name == "api":
                        aliases.add(a.asname or "api")
                    elif module == "bench.api":
                        if a.name not in public:
                            out.append(f"{where}: bench.api.{a.name} (not in bench.api.__all__)")
                    elif not _allowed(module) or module == "bench":
                        out.append(f"{where}: from {module} import {a.name}")
        for node in ast.walk(ast.parse(path.read_text(), where)):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr not in public):
                out.append(f"{where}: api.{node.attr} (not in bench.api.__all__)")
    return out


def _allowed(module: str) -> bool:
    """A module a command may import besides the API: the shared core, another command, the
    standard library, the CLI's libraries."""
    top = module.split(".")[0]
    return (module.startswith(("bench.core", "bench.commands")) or top in CLI_LIBRARIES
            or top in sys.stdlib_module_names)


def test_the_commands_read_only_the_front_door():
    assert front_door_violations(ROOT) == []


@pytest.mark.parametrize("planted, expected", [
    ("def f():\n    from evaluators.runner.run import run_evaluation\n",
     "bench/commands/planted.py: from evaluators.runner.run import run_evaluation"),
    ("import leaderboards.board\n", "bench/commands/planted.py: import leaderboards.board"),
    ("import pyarrow.parquet as pq\n", "bench/commands/planted.py: import pyarrow.parquet"),
    ("from bench.api import run_evaluation\n", "bench/commands/planted.py: bench.api.run_evaluation (not in"),
    ("from bench.api.evaluation import evaluate\n", "bench/commands/planted.py: from bench.api.evaluation import"),
    ("from bench import api\ndef f():\n    return api.load_selected('results')\n",
     "bench/commands/planted.py: api.load_selected (not in"),
    ("from bench import api as front\nx = front.METRIC_KEYS\n", "bench/commands/planted.py: api.METRIC_KEYS (not in"),
])
def test_a_command_reaching_past_the_front_door_is_caught(tmp_path, planted, expected):
    shutil.copytree(ROOT / "bench", tmp_path / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    assert front_door_violations(tmp_path) == []
    (tmp_path / "bench" / "commands" / "planted.py").write_text(planted)
    assert [v for v in front_door_violations(tmp_path) if v.startswith(expected)]


def test_the_front_door_is_real_functions():
    """No lazy re-export: every public name is defined in the package (a reader follows it), and an
    unknown one is an AttributeError, not an import."""
    from bench import api

    assert set(api.__all__) == api_names(ROOT) and not hasattr(api, "__getattr__")
    for name in api.__all__:
        assert name in vars(api) and getattr(api, name).__module__.startswith(("bench.api", "bench.core")), name
    with pytest.raises(AttributeError):
        api.run_evaluation  # noqa: B018


def test_help_loads_neither_torch_nor_pandas():
    """`bench --help` and every command's `--help` import the API and the commands, whose
    functions import torch, pandas and matplotlib only when called."""
    script = ("import sys\nfrom bench.cli import main\n"
              "for args in (['--help'], ['evaluate', '--help'], ['leaderboard', '--help'], ['run', '--help'],"
              " ['zoo', 'train', '--help'], ['cache', 'rm', '--help'], ['report', '--help']):\n"
              "    assert main(args) == 0, args\n"
              "print(sorted(m for m in ('torch', 'pandas', 'matplotlib') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
