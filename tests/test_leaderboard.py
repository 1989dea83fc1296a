"""Results store and leaderboard views on synthetic results tables with known answers."""

from __future__ import annotations

import csv
import io
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.cli import main
from bench.commands.common import Format
from bench.errors import BenchError
from bench.results import provenance, write_run
from leaderboards.store import latest, load_results
from leaderboards.tables import build_leaderboard, rank_with_ties, render_leaderboard, resolve_metric


def result_row(backbone: str, probe: str, value: float | None, *, half: float = 0.02, metric: str = "beta_star",
               dataset: str = "cs", fingerprint: str = "fp-cs", tokens: str = "cls", layer: int = 0,
               n_layers: int = 0, seed: int = 0, task: str = "binding", status: str = "ok",
               run_id: str = "r1", created_at: str = "2026-01-01T00:00:00+00:00", error: str | None = None) -> dict:
    """One results row in the real schema; the metric gets value ± half as its interval."""
    row = {
        **provenance(run_id, "cpu"), "created_at": created_at, "backbone": backbone, "dataset": dataset,
        "dataset_fingerprint": fingerprint, "split": "test", "layer": layer, "n_layers": n_layers,
        "tokens": tokens, "task": task, "probe": probe, "seed": seed, "status": status, "error": error,
    }
    if value is not None:
        row.update({metric: value, f"{metric}_lo": value - half, f"{metric}_hi": value + half})
    return row


def paper_like_rows() -> list[dict]:
    """A: strong; B: within A's interval (ties); C: clearly worse; D: no dnn run (incomplete)."""
    rows = []
    for backbone, lin, dnn in [("A", 0.10, 0.90), ("B", 0.12, 0.88), ("C", 0.05, 0.50), ("D", 0.20, None)]:
        rows.append(result_row(backbone, "linear", lin))
        if dnn is not None:
            rows.append(result_row(backbone, "dnn", dnn))
    return rows


def run_cli(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_rank_with_ties_overlapping_intervals_share_a_rank():
    scores = [(0.90, 0.85, 0.95), (0.88, 0.80, 0.96), (0.50, 0.45, 0.55), (0.70, 0.52, 0.79)]
    # A and B overlap; D overlaps C but not A/B; C is beaten beyond doubt by A and B only
    assert rank_with_ties(scores) == [1, 1, 3, 3]
    # lower is better (code lengths): mirror image
    assert rank_with_ties([(1.0, 0.9, 1.1), (1.05, 0.95, 1.2), (3.0, 2.9, 3.1)], higher_is_better=False) == [1, 1, 3]
    assert rank_with_ties([(0.5, None, None), (0.4, None, None)]) == [1, 2]


def test_leaderboard_ranks_ties_and_leaves_incomplete_backbones_unranked_with_empty_cells():
    board = build_leaderboard(paper_like_rows())
    assert board.columns == [("linear", "cls"), ("dnn", "cls")]
    assert [(r.backbone, r.rank) for r in board.rows] == [("A", 1), ("B", 1), ("C", 3), ("D", None)]
    d = board.rows[-1]
    assert d.cells[("dnn", "cls")] is None and d.cells[("linear", "cls")].value == pytest.approx(0.20)
    assert board.rows[0].score.value == pytest.approx(0.90)  # ranked by the best cell


def failed_probe_rows() -> list[dict]:
    """A binds (0.40); P's dnn F-probe failed (β* 2.9, the pixels/dnn case), its linear cell is
    sound (0.10); R fails everywhere (its O-probe is worse than the prior)."""
    def with_bounds(row: dict, b_f_hi: float = 1.0, b_o_hi: float = 1.0) -> dict:
        return {**row, "B_F_hi": b_f_hi, "B_O_hi": b_o_hi}

    return [
        with_bounds(result_row("A", "linear", 0.30)), with_bounds(result_row("A", "dnn", 0.40)),
        with_bounds(result_row("P", "linear", 0.10)), with_bounds(result_row("P", "dnn", 2.90), b_f_hi=-0.7),
        with_bounds(result_row("R", "linear", -0.5), b_o_hi=-0.4), with_bounds(result_row("R", "dnn", -0.6), b_o_hi=-0.2),
    ]


def test_failed_probe_cells_are_marked_and_never_rank(tmp_path, capsys):
    board = build_leaderboard(failed_probe_rows())
    ranks = {r.backbone: r.rank for r in board.rows}
    assert ranks == {"A": 1, "P": 2, "R": None}  # P by its sound linear cell, not its 290% dnn cell
    p = next(r for r in board.rows if r.backbone == "P")
    assert p.score.value == pytest.approx(0.10)
    assert p.cells[("dnn", "cls")].checks == ("L_F > H(F)", "L_O < L_F")
    write_run(failed_probe_rows(), tmp_path, "r1")
    code, out, _ = run_cli(["leaderboard", tmp_path, "--format", "markdown"], capsys)
    assert code == 0
    assert "| 2 | P | 10.0 ± 2.0 | 290.0 ± 2.0 ‡ |" in out and "‡ a probe failed" in out
    code, out, _ = run_cli(["leaderboard", tmp_path, "--format", "csv"], capsys)
    flagged = {(r["backbone"], r["probe"]): r["checks"] for r in csv.DictReader(io.StringIO(out))}
    assert flagged[("P", "dnn")] == "L_F > H(F); L_O < L_F" and flagged[("P", "linear")] == ""
    assert flagged[("R", "linear")] == "L_O > H(O)"
    # β*_cond needs no F-probe: the same failed row is a plain reading there
    cond = [{**result_row("P", "dnn", 0.2, metric="beta_star_cond"), "B_F_hi": -0.7, "beta_star_lo": 2.8}]
    assert build_leaderboard(cond, metric="beta_star_cond").rows[0].cells[("dnn", "cls")].checks == ()


def test_best_layer_skips_a_layer_whose_probe_failed():
    rows = [{**result_row("M", "dnn", v, layer=layer, n_layers=2), "B_F_hi": b_f_hi}
            for layer, v, b_f_hi in [(1, 0.35, 1.0), (2, 1.80, -0.5)]]
    cell = build_leaderboard(rows).rows[0].cells[("dnn", "cls")]
    assert (cell.layer, cell.value, cell.checks) == (1, pytest.approx(0.35), ())


MARKDOWN_SNAPSHOT = """\
**β* (%) — cs — best layer per cell**

| rank | backbone | linear / cls | dnn / cls |
|---|---|---|---|
| 1 | A | 10.0 ± 2.0 | 90.0 ± 2.0 |
| 1 | B | 12.0 ± 2.0 | 88.0 ± 2.0 |
| 3 | C | 5.0 ± 2.0 | 50.0 ± 2.0 |
|  | D | 20.0 ± 2.0 |  |

_± is half the bootstrap 95% interval; backbones whose intervals overlap share a rank; \
empty = not run or incomplete, unranked = some cell empty or failed_"""


def test_markdown_snapshot(tmp_path, capsys):
    write_run(paper_like_rows(), tmp_path, "r1")
    code, out, err = run_cli(["leaderboard", tmp_path, "--format", "markdown"], capsys)
    assert code == 0, err
    assert out.rstrip("\n") == MARKDOWN_SNAPSHOT


def test_csv_and_json_parse_back_to_the_same_numbers(tmp_path, capsys):
    write_run(paper_like_rows(), tmp_path, "r1")
    code, out, _ = run_cli(["leaderboard", tmp_path, "--format", "csv"], capsys)
    assert code == 0
    records = list(csv.DictReader(io.StringIO(out)))
    code, out, _ = run_cli(["leaderboard", tmp_path, "--format", "json"], capsys)
    assert code == 0
    js = json.loads(out)
    assert len(records) == len(js) == 8  # 4 backbones x 2 columns, the missing cell included
    by_key = {(r["backbone"], r["probe"]): r for r in js}
    assert by_key[("B", "dnn")]["value"] == 0.88 and by_key[("B", "dnn")]["rank"] == 1
    assert by_key[("B", "dnn")]["lo"] == pytest.approx(0.86) and by_key[("B", "dnn")]["half_width"] == pytest.approx(0.02)
    assert by_key[("D", "dnn")]["status"] == "missing" and by_key[("D", "dnn")]["value"] is None
    for r in records:  # CSV carries full float precision, identical to JSON
        j = by_key[(r["backbone"], r["probe"])]
        assert (float(r["value"]) if r["value"] else None) == j["value"]
        assert (float(r["hi"]) if r["hi"] else None) == j["hi"]
        assert (int(r["rank"]) if r["rank"] else None) == j["rank"]


def test_table_output_is_plain_when_piped(tmp_path, capsys):
    write_run(paper_like_rows(), tmp_path, "r1")
    code, out, _ = run_cli(["leaderboard", tmp_path], capsys)
    assert code == 0
    assert "\x1b[" not in out and "[dim]" not in out
    assert re.search(r"A\s*│\s*10\.0 ± 2\.0\s*│\s*90\.0 ± 2\.0", out)


def test_out_file_gets_the_same_text(tmp_path, capsys):
    write_run(paper_like_rows(), tmp_path / "res", "r1")
    code, _, _ = run_cli(["leaderboard", tmp_path / "res", "--format", "markdown", "--out", tmp_path / "lb.md"], capsys)
    assert code == 0
    assert (tmp_path / "lb.md").read_text().rstrip("\n") == MARKDOWN_SNAPSHOT


def test_fingerprint_mismatch_under_one_dataset_name_is_refused(tmp_path, capsys):
    write_run([result_row("A", "linear", 0.1, fingerprint="aaaaaaaaaaaaaaaa", run_id="run1")], tmp_path, "run1")
    write_run([result_row("B", "linear", 0.1, fingerprint="bbbbbbbbbbbbbbbb", run_id="run2")], tmp_path, "run2")
    with pytest.raises(BenchError, match="'cs'.*2 different datasets"):
        load_results(tmp_path)
    code, out, err = run_cli(["leaderboard", tmp_path], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "aaaaaaaaaaaa (run run1)" in err and "bbbbbbbbbbbb (run run2)" in err


def test_other_datasets_may_have_other_fingerprints_and_rank_separately(tmp_path):
    rows = [result_row("A", "linear", 0.9), result_row("B", "linear", 0.1),
            result_row("A", "linear", 0.2, dataset="other", fingerprint="fp-o"),
            result_row("B", "linear", 0.8, dataset="other", fingerprint="fp-o")]
    write_run(rows, tmp_path, "r1")
    board = build_leaderboard(latest(load_results(tmp_path)))
    assert [(r.dataset, r.backbone, r.rank) for r in board.rows] == [("cs", "A", 1), ("cs", "B", 2), ("other", "B", 1), ("other", "A", 2)]
    assert "| rank | dataset | backbone |" in render_leaderboard(board, Format.markdown)


def test_error_rows_are_kept_shown_and_superseded_by_a_later_success(tmp_path):
    failed = result_row("A", "dnn", None, status="error", error="probe diverged", run_id="r1")
    write_run([result_row("A", "linear", 0.1), failed], tmp_path, "r1")
    rows = load_results(tmp_path)
    assert [r["status"] for r in rows] == ["ok", "error"]
    board = build_leaderboard(latest(rows))
    cell = board.rows[0].cells[("dnn", "cls")]
    assert cell.status == "error" and cell.error == "probe diverged" and board.rows[0].rank is None
    assert "error" in render_leaderboard(board, Format.markdown)
    write_run([result_row("A", "dnn", 0.7, run_id="r2", created_at="2026-01-02T00:00:00+00:00")], tmp_path, "r2")
    board = build_leaderboard(latest(load_results(tmp_path)))
    assert board.rows[0].cells[("dnn", "cls")].value == pytest.approx(0.7) and board.rows[0].rank == 1


def test_seeds_average_with_interval_envelope_and_missing_seeds_leave_the_cell_empty():
    rows = [result_row("A", "linear", 0.6, seed=0), result_row("A", "linear", 0.7, seed=1, half=0.05),
            result_row("B", "linear", 0.9, seed=0)]  # B lacks seed 1
    board = build_leaderboard(rows)
    a = next(r for r in board.rows if r.backbone == "A").cells[("linear", "cls")]
    assert (a.value, a.lo, a.hi, a.n_seeds) == (pytest.approx(0.65), pytest.approx(0.58), pytest.approx(0.75), 2)
    b = next(r for r in board.rows if r.backbone == "B")
    assert b.cells[("linear", "cls")].status == "incomplete" and b.rank is None
    assert "| 1 | A | 65.0 ± 8.5 |\n|  | B |  |\n" in render_leaderboard(board, Format.markdown)


def layered_rows() -> list[dict]:
    values = [0.1, 0.5, 0.7, 0.4]  # layers 0..3 of a 3-block backbone: best is layer 2
    return [result_row("vit", "linear", v, layer=i, n_layers=3) for i, v in enumerate(values)] + [
        result_row("oracle:objects", "linear", 1.0)]


@pytest.mark.parametrize("layer, expected", [("best", (2, 0.7)), ("last", (3, 0.4)), ("1", (1, 0.5)), (0, (0, 0.1))])
def test_layer_selection(layer, expected):
    board = build_leaderboard(layered_rows(), layer=layer)
    cell = next(r for r in board.rows if r.backbone == "vit").cells[("linear", "cls")]
    assert (cell.layer, cell.value) == (expected[0], pytest.approx(expected[1]))
    md = render_leaderboard(board, Format.markdown)
    assert f"<sub>L{expected[0]}</sub>" in md and "100.0 ± 2.0 |" in md  # oracle: no layer note


def test_layer_beyond_a_backbone_leaves_it_empty_but_layerless_references_stay():
    board = build_leaderboard(layered_rows(), layer=7)
    cells = {r.backbone: r.cells[("linear", "cls")] for r in board.rows}
    assert cells["vit"] is None and cells["oracle:objects"].value == 1.0


def test_filters_metrics_and_tasks(tmp_path, capsys):
    rows = paper_like_rows()
    rows[0].update(B_star=10.0, B_star_lo=9.5, B_star_hi=10.5)  # A / linear: other rows lack B*
    rows += [result_row("A", "quadratic", 0.93, metric="accuracy", task="issameobject", tokens="all", layer=2, n_layers=3)]
    write_run(rows, tmp_path, "r1")
    code, out, _ = run_cli(["leaderboard", tmp_path, "--probe", "dnn", "--format", "json"], capsys)
    assert code == 0 and {r["probe"] for r in json.loads(out)} == {"dnn"}
    code, out, _ = run_cli(["leaderboard", tmp_path, "--metric", "B*", "--probe", "linear", "--format", "markdown"], capsys)
    assert code == 0 and "B* (bits)" in out and "| A | 10.00 ± 0.50 |" in out
    code, out, _ = run_cli(["leaderboard", tmp_path, "--task", "issameobject", "--format", "markdown"], capsys)
    assert code == 0 and "IsSameObject accuracy (%)" in out and "| 1 | A | 93.0 ± 2.0 <sub>L2</sub> |" in out
    assert resolve_metric("β*_cond", "binding").name == "beta_star_cond"


@pytest.mark.parametrize("args, message", [
    (["--metric", "loss"], "metric: unknown 'loss'"),
    (["--metric", "accuracy"], "metric: 'accuracy' belongs to task 'issameobject'"),
    (["--task", "segmentation"], "task: unknown 'segmentation'"),
    (["--layer", "deep"], "layer: expected best, last or a layer index"),
    (["--probe", "mlp"], "probe: no results for 'mlp'; present: dnn, linear"),
    (["--dataset", "nope"], "dataset: no results for 'nope'; present: cs"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, args, message):
    write_run(paper_like_rows(), tmp_path, "r1")
    code, out, err = run_cli(["leaderboard", tmp_path, *args], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert message in err


def test_empty_missing_and_foreign_results_dirs_exit_2(tmp_path, capsys):
    code, _, err = run_cli(["leaderboard", tmp_path], capsys)
    assert code == 2 and "no runs in" in err
    code, _, err = run_cli(["leaderboard", tmp_path / "nope"], capsys)
    assert code == 2 and "is not a directory" in err
    table = pa.table({"x": [1]}).replace_schema_metadata({b"bindingbench_results_schema_version": b"1"})
    pq.write_table(table, tmp_path / "foreign.parquet")
    code, _, err = run_cli(["leaderboard", tmp_path], capsys)
    assert code == 2 and err.count("\n") == 1 and "foreign.parquet" in err
    (tmp_path / "foreign.parquet").unlink()
    pq.write_table(pa.table({"x": [1]}), tmp_path / "old.parquet")
    code, _, err = run_cli(["leaderboard", tmp_path], capsys)
    assert code == 2 and "schema version none" in err


def test_generators_and_info_honour_json(balanced_small, capsys):
    code, out, _ = run_cli(["generators", "--format", "json"], capsys)
    rows = json.loads(out)
    assert code == 0 and any(r["generator"] == "colorshape" and r["preset"] == "balanced" and r["default"] is True for r in rows)
    code, out, _ = run_cli(["info", balanced_small, "--format", "json"], capsys)
    assert code == 0 and json.loads(out)["splits"]["test"]["n"] == 20
