"""No number moves unless it is meant to: the golden evaluation (tests/golden.py, in a process of its
own on the numerical libraries' portable code paths, so on any x86-64 machine) gives the rows kept
in tests/data/golden.json, every number identical (floats exactly, per-scene bits too)."""

from __future__ import annotations

import json

from tests.golden import GOLDEN, measure


def test_the_golden_rows_are_measured_again_identically():
    kept = json.loads(GOLDEN.read_text())
    now = measure()
    versions = ("probe_code_version", "schema_version")
    regenerate = "python tests/golden.py --write (with PYTHONPATH at the repository)"
    if any(kept[v] != now[v] for v in versions):
        raise AssertionError(f"{', '.join(f'{v} {kept[v]} -> {now[v]}' for v in versions)}: the numbers were meant to "
                             f"move; regenerate the golden rows with `{regenerate}` and commit them")
    assert len(now["rows"]) == len(kept["rows"])
    for old, new in zip(kept["rows"], now["rows"]):
        moved = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        assert not moved, (f"{old['backbone']} {old['task']} layer {old['layer']} {old['tokens']} {old['probe']}: "
                           f"{moved} moved with {versions} unchanged; a change that moves numbers on purpose raises "
                           f"PROBE_CODE_VERSION and runs `{regenerate}`")
