"""The `benchmarks/` scripts stay readable along their seams (issue 57): no file over 450 lines, and
none reaches into a sibling's private names (a part that another needs says so by a public name).
Read from source with `ast`; shown to catch planted violations."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 450


def private_uses(path: Path, siblings: set[str]) -> list[str]:
    """`file: module._name` for each private name of a sibling module that `path` imports or reads:
    `from benchmarks.x import _name`, or `x._name` where `x` is a sibling module imported by name."""
    tree = ast.parse(path.read_text(), str(path))
    aliases: dict[str, str] = {}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "benchmarks":
            aliases.update({a.asname or a.name: a.name for a in node.names if a.name in siblings})
        elif isinstance(node, ast.ImportFrom) and (node.module or "").removeprefix("benchmarks.") in siblings:
            out += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            aliases.update({a.asname: a.name.removeprefix("benchmarks.") for a in node.names
                            if a.asname and a.name.removeprefix("benchmarks.") in siblings})
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            out.append(f"{path.name}: {aliases[node.value.id]}.{node.attr}")
    return out


def problems(folder: Path) -> list[str]:
    files = sorted(folder.glob("*.py"))
    siblings = {f.stem for f in files}
    long = [f"{f.name}: {n} lines" for f in files if (n := len(f.read_text().splitlines())) > MAX_LINES]
    return long + [use for f in files for use in private_uses(f, siblings)]


def test_benchmark_files_are_short_and_use_only_public_names():
    assert problems(ROOT / "benchmarks") == []


@pytest.mark.parametrize("planted, expected", [
    ({"planted.py": "x = 1\n" * (MAX_LINES + 1)}, f"planted.py: {MAX_LINES + 1} lines"),
    ({"planted.py": "from benchmarks.gpu_fits import _num\n"}, "planted.py: benchmarks.gpu_fits._num"),
    ({"planted.py": "from benchmarks import gpu_pool as pool\n\ndef f():\n    return pool._started\n"},
     "planted.py: gpu_pool._started"),
    ({"planted.py": "import benchmarks.gpu_timeline as t\nt._union([])\n"}, "planted.py: gpu_timeline._union"),
])
def test_a_planted_violation_is_caught(tmp_path, planted, expected):
    shutil.copytree(ROOT / "benchmarks", tmp_path / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
    for name, text in planted.items():
        (tmp_path / "benchmarks" / name).write_text(text)
    assert expected in problems(tmp_path / "benchmarks")
