"""The code stays readable along its seams (issue 57): no file in `bench/`, `evaluators/`,
`generators/`, `leaderboards/` or `benchmarks/` over 450 lines, and no module reaches into another
module's private names (a part that another needs says so by a public name, with a docstring, in
the module that owns it). Read from source with `ast`; shown to catch planted violations."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bench", "evaluators", "generators", "leaderboards", "benchmarks")
MAX_LINES = 450


def project_modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the five packages (a package by its `__init__.py`)."""
    out = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def dotted(node: ast.expr) -> str | None:
    """`a.b.c` for a chain of attributes on a name, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def private_uses(name: str, path: Path, modules: dict[str, Path], root: Path) -> list[str]:
    """`file: module._name` for each private name of another project module that the module `name`
    (at `path`) imports or reads: `from evaluators.x import _name` (relative imports too), or
    `x._name` where `x` is a project module imported by name (`import a.b as x`, `from a import x`,
    or `a.b.x._name` after `import a.b.x`)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    where = path.relative_to(root).as_posix()
    aliases: dict[str, str] = {}  # a local name bound to a project module
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                if f"{base}.{a.name}" in modules:
                    aliases[a.asname or a.name] = f"{base}.{a.name}"
                elif base in modules and base != name and private(a.name):
                    out.append(f"{where}: {base}.{a.name}")
        elif isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in modules})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr) and (chain := dotted(node.value)):
            head, _, rest = chain.partition(".")
            module = ".".join(filter(None, [aliases.get(head, head), rest]))
            if module in modules and module != name:
                out.append(f"{where}: {module}.{node.attr}")
    return out


def problems(root: Path) -> list[str]:
    """Every file over `MAX_LINES` lines, then every read of another module's private name."""
    modules = project_modules(root)
    long = [f"{p.relative_to(root).as_posix()}: {n} lines" for p in modules.values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    return long + [use for name, path in modules.items() for use in private_uses(name, path, modules, root)]


def test_files_are_short_and_use_only_public_names():
    assert problems(ROOT) == []


@pytest.mark.parametrize("planted, expected", [
    ({"benchmarks/planted.py": "x = 1\n" * (MAX_LINES + 1)}, f"benchmarks/planted.py: {MAX_LINES + 1} lines"),
    ({"leaderboards/planted.py": "x = 1\n" * (MAX_LINES + 1)}, f"leaderboards/planted.py: {MAX_LINES + 1} lines"),
    ({"benchmarks/planted.py": "from benchmarks.gpu_fits import _num\n"},
     "benchmarks/planted.py: benchmarks.gpu_fits._num"),
    ({"benchmarks/planted.py": "from benchmarks import gpu_pool as pool\n\ndef f():\n    return pool._started\n"},
     "benchmarks/planted.py: benchmarks.gpu_pool._started"),
    ({"benchmarks/planted.py": "import benchmarks.gpu_timeline as t\nt._union([])\n"},
     "benchmarks/planted.py: benchmarks.gpu_timeline._union"),
    ({"evaluators/fitting/planted.py": "def f():\n    from evaluators.fitting.gradient import _secret\n"},
     "evaluators/fitting/planted.py: evaluators.fitting.gradient._secret"),
    ({"evaluators/backbones/planted.py": "from .hf import _secret\n"},
     "evaluators/backbones/planted.py: evaluators.backbones.hf._secret"),
    ({"bench/planted.py": "import evaluators.cache.entries\nevaluators.cache.entries._secret()\n"},
     "bench/planted.py: evaluators.cache.entries._secret"),
    ({"leaderboards/planted.py": "from evaluators.tasks.binding import metrics\nmetrics._secret\n"},
     "leaderboards/planted.py: evaluators.tasks.binding.metrics._secret"),
])
def test_a_planted_violation_is_caught(tmp_path, planted, expected):
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for name, text in planted.items():
        (tmp_path / name).write_text(text)
    assert expected in problems(tmp_path)
