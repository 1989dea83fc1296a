"""No number moves unless it is meant to: the golden evaluation (tests/golden.py, in a process of its
own on the numerical libraries' portable code paths) gives the rows kept in tests/data/golden.json:
on a processor of the writer's vendor every number identical (floats exactly, per-scene bits too);
on another vendor's, the cells a fit's choices amplify within the spread the writer measured under
other kernels, and every other number to one part in a million (tests/golden.py says why)."""

from __future__ import annotations

import json

import pytest

from tests.golden import FLOOR, GOLDEN, calibrate, measure, moved, vendor


def test_the_golden_rows_are_measured_again():
    kept = json.loads(GOLDEN.read_text())
    now = measure()
    versions = ("probe_code_version", "schema_version")
    regenerate = "python tests/golden.py --write (with PYTHONPATH at the repository)"
    if any(kept[v] != now[v] for v in versions):
        raise AssertionError(f"{', '.join(f'{v} {kept[v]} -> {now[v]}' for v in versions)}: the numbers were meant to "
                             f"move; regenerate the golden rows with `{regenerate}` and commit them")
    assert len(now["rows"]) == len(kept["rows"])
    exact = kept["vendor"] == vendor()
    diff = moved(kept, now, exact)
    assert not diff, (f"{len(diff)} cell(s) moved with {versions} unchanged "
                      f"({'exactly, on a' if exact else 'beyond their tolerance, on another'} vendor's processor: "
                      f"{vendor()}, golden rows by {kept['vendor']}); a change that moves numbers on purpose raises "
                      f"PROBE_CODE_VERSION and runs `{regenerate}`:\n" + "\n".join(diff[:40]))


ROW = {"backbone": "b", "task": "binding", "layer": 0, "tokens": "cls", "probe": "linear"}


def test_another_vendor_is_held_to_the_spread_the_writer_measured():
    """A cell that the writer's other kernels moved may move by twice that on another vendor's
    processor, a choice they flipped (a non-number) not at all counted; every other number only to
    one part in a million; on the writer's vendor nothing may move."""
    rows = [{**ROW, "beta_star": 0.5, "B_F": 2.0, "config": "{\"strength\": 0.001}", "n": 96}]
    others = [[{**rows[0], "beta_star": 0.51, "config": "{\"strength\": 0.0003}"}]]
    kept = {"rows": rows, "spread": calibrate(rows, others)}
    assert kept["spread"] == {"0": {"beta_star": pytest.approx(0.01), "config": True}}
    near = {"rows": [{**rows[0], "beta_star": 0.519, "config": "{\"strength\": 0.01}", "B_F": 2.0 * (1 + FLOOR / 2)}]}
    assert moved(kept, near, exact=False) == []
    assert len(moved(kept, near, exact=True)) == 3
    far = {"rows": [{**rows[0], "beta_star": 0.53}]}
    assert [m.split(": ")[1].split(" ")[0] for m in moved(kept, far, exact=False)] == ["beta_star"]
    for column, value in (("B_F", 2.0 * (1 + 3 * FLOOR)), ("n", 97)):
        assert len(moved(kept, {"rows": [{**rows[0], column: value}]}, exact=False)) == 1, column
