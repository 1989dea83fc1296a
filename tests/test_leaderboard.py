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
from bench.core.errors import BenchError
from bench.core.results import provenance, write_run
from leaderboards.store import latest, load_results, select_rows
from leaderboards.board import Cell, beats, build_leaderboard
from leaderboards.metrics import resolve_metric
from leaderboards.render import render_leaderboard, render_leaderboards, tidy_records


def result_row(backbone: str, probe: str, value: float | None, *, half: float = 0.02, metric: str = "beta_star",
               dataset: str = "cs", fingerprint: str = "fp-cs", tokens: str = "cls", layer: int = 0,
               n_layers: int = 0, seed: int = 0, task: str = "binding", status: str = "ok",
               run_id: str = "r1", created_at: str = "2026-01-01T00:00:00+00:00", error: str | None = None,
               prior: str = "exact", converged: bool = True, n_F_eff: float | None = 4.12,
               limit: int | None = None) -> dict:
    """One results row in the real schema; the metric gets value ± half as its interval.
    Binding rows are anchored and converged unless told otherwise."""
    row = {
        **provenance(run_id, "cpu"), "created_at": created_at, "backbone": backbone, "dataset": dataset,
        "dataset_fingerprint": fingerprint, "limit": limit, "split": "test", "layer": layer, "n_layers": n_layers,
        "tokens": tokens, "task": task, "probe": probe, "seed": seed, "status": status, "error": error,
    }
    if task == "binding":
        row.update(prior=prior, converged=converged, n_F_eff=n_F_eff)
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


def test_without_per_scene_bits_a_cell_beats_another_only_when_the_intervals_part():
    beta, length = resolve_metric("beta_star", "binding"), resolve_metric("L_O_given_F", "binding")

    def cell(v, lo, hi):
        return Cell("ok", v, lo, hi)

    assert beats(cell(0.90, 0.85, 0.95), cell(0.50, 0.45, 0.55), beta)
    assert not beats(cell(0.90, 0.85, 0.95), cell(0.88, 0.80, 0.96), beta)  # overlapping: no one wins
    assert not beats(cell(0.50, 0.45, 0.55), cell(0.90, 0.85, 0.95), beta)
    assert beats(cell(1.0, 0.9, 1.1), cell(3.0, 2.9, 3.1), length)  # lower is better: mirror image
    assert beats(cell(0.5, None, None), cell(0.4, None, None), beta)


def test_leaderboard_ranks_ties_and_ranks_a_backbone_on_the_cells_it_has():
    board = build_leaderboard(paper_like_rows())
    assert board.columns == [("linear", "cls"), ("dnn", "cls")]
    # D never ran dnn: it ranks on its linear 20%, below the three whose best cells clear it
    assert [(r.backbone, r.rank) for r in board.rows] == [("A", 1), ("B", 1), ("C", 3), ("D", 4)]
    d = board.rows[-1]
    assert d.cells[("dnn", "cls")] is None and d.score.value == pytest.approx(0.20)
    assert board.rows[0].score.value == pytest.approx(0.90)  # ranked by the best cell


def failed_probe_rows() -> list[dict]:
    """A binds (0.40); P's dnn F-probe coded worse than its prior (a ‡ 60% cell), its linear cell
    is sound (0.10); R fails everywhere (its O|F-probe ended worse than the prior it started from)."""
    def with_bounds(row: dict, b_f_hi: float = 1.0, b_star_hi: float = 1.0) -> dict:
        return {**row, "B_F_hi": b_f_hi, "B_star_hi": b_star_hi}

    return [
        with_bounds(result_row("A", "linear", 0.30)), with_bounds(result_row("A", "dnn", 0.40)),
        with_bounds(result_row("P", "linear", 0.10)), with_bounds(result_row("P", "dnn", 0.60), b_f_hi=-0.7),
        with_bounds(result_row("R", "linear", -0.05), b_star_hi=-0.4),
        with_bounds(result_row("R", "dnn", -0.06), b_star_hi=-0.2),
    ]


def test_failed_probe_cells_are_marked_and_never_rank(tmp_path, capsys):
    board = build_leaderboard(failed_probe_rows())
    ranks = {r.backbone: r.rank for r in board.rows}
    assert ranks == {"A": 1, "P": 2, "R": None}  # P by its sound linear cell, not its ‡ 60% dnn cell
    p = next(r for r in board.rows if r.backbone == "P")
    assert p.score.value == pytest.approx(0.10)
    assert p.cells[("dnn", "cls")].checks == ("L_F > H(F)",)
    assert board.fired_checks == ["L_F > H(F)", "L_O|F > H(O|F)"]
    write_run(failed_probe_rows(), tmp_path, "r1")
    code, out, _ = run_cli(["leaderboard", tmp_path, "--format", "markdown"], capsys)
    assert code == 0
    assert "| 2 | P | 10.0 ± 2.0 | 60.0 ± 2.0 ‡ |" in out
    # the ‡ note says what β* is now and names the checks that fired (and only those)
    note = next(line for line in out.splitlines() if line.startswith("_‡"))
    assert "β* = 1 − L_O|F / H(O|F)" in note and "exact prior" in note
    assert "L_F > H(F) (the F-probe" in note and "L_O|F > H(O|F) (the O|F-probe" in note
    assert "L_O < L_F" not in note and "not converged" not in note
    code, out, _ = run_cli(["leaderboard", tmp_path, "--format", "csv"], capsys)
    flagged = {(r["backbone"], r["probe"]): r["checks"] for r in csv.DictReader(io.StringIO(out))}
    assert flagged[("P", "dnn")] == "L_F > H(F)" and flagged[("P", "linear")] == ""
    assert flagged[("R", "linear")] == "L_O|F > H(O|F)"


def paper_rows() -> list[dict]:
    """The paper's estimator beside the headline one, on the same runs: A's dnn β*_paper interval
    lies above 1 (its direct O-probe beat its F-probe on test codes it never saw) while its
    anchored β* is a sound 0.35; B is sound under both."""
    rows = []
    for backbone, probe, star, paper in [("A", "linear", 0.05, 0.02), ("A", "dnn", 0.35, 2.90),
                                         ("B", "linear", 0.04, 0.03), ("B", "dnn", 0.20, 0.25)]:
        row = result_row(backbone, probe, star)
        row.update(beta_star_paper=paper, beta_star_paper_lo=paper - 0.05, beta_star_paper_hi=paper + 0.05,
                   B_F_hi=1.0, B_star_hi=1.0, B_F_paper_hi=1.0, B_O_paper_hi=1.0,
                   L_O_given_F=20.0 * (1 - star), L_O_given_F_lo=19.0 * (1 - star), L_O_given_F_hi=21.0 * (1 - star))
        rows.append(row)
    return rows


def test_checks_follow_the_metric_shown():
    star = build_leaderboard(paper_rows())
    paper = build_leaderboard(paper_rows(), metric="beta_star_paper")
    a_star = next(r for r in star.rows if r.backbone == "A")
    a_paper = next(r for r in paper.rows if r.backbone == "A")
    assert a_star.cells[("dnn", "cls")].checks == () and not star.has_failed_cells
    assert a_paper.cells[("dnn", "cls")].checks == ("L_O < L_F",)
    assert (a_star.score.value, a_paper.score.value) == (pytest.approx(0.35), pytest.approx(0.02))  # 290% never ranks
    assert [r.backbone for r in star.rows] == ["A", "B"] and [r.backbone for r in paper.rows] == ["B", "A"]
    md = render_leaderboard(paper, Format.markdown)
    assert "**β*_paper (%) — cs — best layer per cell (on validation)**" in md and "290.0 ± 5.0 ‡" in md
    note = next(line for line in md.splitlines() if line.startswith("_‡"))
    assert "paper's difference of two unanchored probes" in note and "L_O < L_F (the direct O-probe beat" in note
    assert "‡" not in render_leaderboard(star, Format.markdown)


def test_unconverged_probes_are_marked_under_every_metric():
    rows = paper_rows()
    rows[1].update(converged=False, converged_paper=False)  # A / dnn
    for metric in ("beta_star", "beta_star_paper", "L_O_given_F"):
        board = build_leaderboard(rows, metric=metric)
        a = next(r for r in board.rows if r.backbone == "A")
        assert "not converged" in a.cells[("dnn", "cls")].checks, metric
    md = render_leaderboard(build_leaderboard(rows), Format.markdown)
    assert "| 35.0 ± 2.0 ‡ |" in md and "not converged (a probe's best epoch lay in the last 10%" in md
    # each estimator answers for its own probes: the paper's unconverged probes leave β* alone
    rows[1].update(converged=True)
    a = next(r for r in build_leaderboard(rows).rows if r.backbone == "A")
    assert "not converged" not in a.cells[("dnn", "cls")].checks


def test_unanchored_rows_are_labelled_and_ranked_apart(tmp_path, capsys):
    rows = [result_row("A", "linear", 0.30), result_row("U", "linear", 0.90, prior="none", n_F_eff=None),
            result_row("V", "linear", 0.50, prior="none", n_F_eff=None)]
    board = build_leaderboard(rows)
    # U's 90% is not comparable with A's 30%: the unanchored backbones rank among themselves, below
    assert [(r.backbone, r.rank) for r in board.rows] == [("A", 1), ("U", 1), ("V", 2)]
    md = render_leaderboard(board, Format.markdown)
    assert "| 1 | A | 30.0 ± 2.0 |" in md and "| 1 | U | 90.0 ± 2.0 † |" in md
    assert ("_† unanchored (prior: none): β* from probes that learned the prior themselves; "
            "not comparable with anchored rows") in md
    # the paper's estimator is unanchored for every row: nothing to set apart there
    paper = [{**r, "beta_star_paper": r["beta_star"], "beta_star_paper_lo": r["beta_star_lo"],
              "beta_star_paper_hi": r["beta_star_hi"]} for r in rows]
    assert "†" not in render_leaderboard(build_leaderboard(paper, metric="β*_paper"), Format.markdown)
    write_run(rows, tmp_path, "r1")
    code, out, _ = run_cli(["leaderboard", tmp_path, "--format", "json"], capsys)
    assert code == 0 and {r["backbone"]: r["prior"] for r in json.loads(out)} == {"A": "exact", "U": "none", "V": "none"}


def test_the_notes_give_the_effective_number_of_test_f_codes():
    md = render_leaderboard(build_leaderboard(paper_like_rows()), Format.markdown)
    assert "effective number of test F codes (n_F_eff = 1/ΣP(f)²): 4.1_" in md
    two = paper_like_rows() + [result_row("A", "linear", 0.2, dataset="uni", fingerprint="fp-u", n_F_eff=2.345),
                               result_row("A", "linear", 0.2, dataset="old", fingerprint="fp-o", n_F_eff=None)]
    board = build_leaderboard(two, probes=["linear"])
    assert board.n_F_eff == {"cs": (4.12,), "old": (), "uni": (2.345,)}
    assert "(n_F_eff = 1/ΣP(f)²): cs 4.1, old unknown, uni 2.3" in render_leaderboard(board, Format.table)
    assert {r["dataset"]: r["n_F_eff"] for r in tidy_records(board)} == {"cs": 4.12, "old": None, "uni": 2.345}
    iso = [result_row("A", "quadratic", 0.9, metric="accuracy", task="issameobject")]
    assert "n_F_eff" not in render_leaderboard(build_leaderboard(iso), Format.markdown)


def test_several_boards_print_each_note_once():
    boards = [build_leaderboard(paper_rows()), build_leaderboard(paper_rows(), metric="beta_star_paper")]
    md = render_leaderboards(boards, Format.markdown)
    assert md.index("**β* (%)") < md.index("**β*_paper (%)")
    assert md.count("n_F_eff = 1/ΣP(f)²") == 1 and md.count("± is half the bootstrap") == 1
    records = json.loads(render_leaderboards(boards, Format.json))
    assert {r["metric"] for r in records} == {"beta_star", "beta_star_paper"} and len(records) == 8


def test_best_layer_skips_a_layer_whose_probe_failed():
    rows = [{**result_row("M", "dnn", v, layer=layer, n_layers=2), "B_F_hi": b_f_hi}
            for layer, v, b_f_hi in [(1, 0.35, 1.0), (2, 1.80, -0.5)]]
    cell = build_leaderboard(rows).rows[0].cells[("dnn", "cls")]
    assert (cell.layer, cell.value, cell.checks) == (1, pytest.approx(0.35), ())


MARKDOWN_SNAPSHOT = """\
**β* (%) — cs — best layer per cell (on validation)**

| rank | backbone | linear / cls | dnn / cls |
|---|---|---|---|
| 1 | A | 10.0 ± 2.0 | 90.0 ± 2.0 |
| 1 | B | 12.0 ± 2.0 | 88.0 ± 2.0 |
| 3 | C | 5.0 ± 2.0 | 50.0 ± 2.0 |
| 4 | D | 20.0 ± 2.0 |  |

_rank: each backbone by its best sound cell among the columns selected (--probe, --tokens; also those a table \
too narrow leaves out) (empty, error and failed-check cells \
neither rank nor unrank it): 1 + the number of backbones better beyond doubt, i.e. whose paired difference on the \
same test scenes (bootstrap over F codes) has a 95% interval wholly above 0; ± is half the bootstrap 95% interval; \
L12 after a value: the layer it comes from (hidden state 12, 0 = embeddings), under --layer best chosen on \
validation; s after a value whose interval holds 0: the probe's sensitivity, the share of a planted binding of \
known size it recovers on this dataset at this size; control rows (O redrawn from p(O|F), true value 0) are never \
ranked; empty = not run or incomplete_

_intervals resample whole test F codes; effective number of test F codes (n_F_eff = 1/ΣP(f)²): 4.1_"""


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


def test_a_dataset_regenerated_in_place_shows_its_newest_data_and_names_the_rest(tmp_path, capsys):
    old, new = "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"
    write_run([result_row("A", "linear", 0.1, fingerprint=old, run_id="run1")], tmp_path, "run1")
    write_run([result_row("B", "linear", 0.3, fingerprint=new, run_id="run2",
                          created_at="2026-01-02T00:00:00+00:00")], tmp_path, "run2")
    code, out, err = run_cli(["leaderboard", tmp_path, "--format", "markdown"], capsys)
    assert code == 0 and "| 1 | B | 30.0 ± 2.0 |" in out and "| A |" not in out
    assert " ".join(err.split()) == ("set aside: 1 binding rows on cs (other data, fingerprint aaaaaaaaaaaa; "
                                     "--fingerprint aaaaaaaaaaaa shows it)")
    assert max(map(len, err.splitlines())) <= 100  # wrapped to the table's width
    code, out, err = run_cli(["leaderboard", tmp_path, "--format", "markdown", "--fingerprint", "aaaa"], capsys)
    assert code == 0 and "| 1 | A | 10.0 ± 2.0 |" in out and "| B |" not in out and "bbbbbbbbbbbb" in err
    code, out, err = run_cli(["leaderboard", tmp_path, "--fingerprint", "cccc"], capsys)
    assert code == 2 and err.count("\n") == 1 and "present: aaaaaaaaaaaa, bbbbbbbbbbbb" in err


def test_limited_rows_never_mix_with_full_ones():
    full = [result_row("A", "linear", 0.5, fingerprint="full"), result_row("B", "linear", 0.4, fingerprint="full")]
    trial = [result_row("A", "linear", 0.9, fingerprint="first100", limit=100, created_at="2026-02-01T00:00:00+00:00"),
             result_row("A", "linear", 0.8, fingerprint="first50", limit=50, created_at="2026-02-02T00:00:00+00:00")]
    chosen = select_rows(full + trial)  # full rows win although the trials are newer
    assert sorted((r["backbone"], r["beta_star"]) for r in chosen.rows) == [("A", 0.5), ("B", 0.4)]
    assert chosen.note == ("set aside: 1 binding rows on cs (--limit 100; --include-limited shows it); "
                           "1 binding rows on cs (--limit 50; --include-limited shows it)")
    shown = select_rows(full + trial, include_limited=True)
    assert shown.note is None
    assert sorted({r["dataset"] for r in shown.rows}) == ["cs", "cs (limit 100)", "cs (limit 50)"]
    board = build_leaderboard(shown.rows)
    assert [(r.dataset, r.backbone, r.rank) for r in board.rows][:2] == [("cs", "A", 1), ("cs", "B", 2)]
    # with nothing but trials, the newest trial is shown (alone), the older one set aside
    only = select_rows(trial)
    assert [(r["dataset"], r["limit"]) for r in only.rows] == [("cs", 50)] and "--limit 100" in only.note


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
    assert cell.status == "error" and cell.error == "probe diverged"
    assert board.rows[0].rank == 1 and board.rows[0].score.value == pytest.approx(0.1)  # on its linear cell
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
    for spelling in ("β*_paper", "beta_star_paper", "B*paper", "β* paper"):
        assert resolve_metric(spelling, "binding").name == ("B_star_paper" if spelling[0] == "B" else "beta_star_paper")
    assert resolve_metric("L_O|F", "binding").name == "L_O_given_F"
    assert resolve_metric("β_O_paper", "binding").name == "beta_O_paper"


@pytest.mark.parametrize("args, message", [
    (["--metric", "loss"], "metric: unknown 'loss'"),
    (["--metric", "beta_star_cond"], "metric: unknown 'beta_star_cond'"),  # replaced by the anchored β*
    (["--metric", "accuracy"], "metric: 'accuracy' belongs to task 'issameobject'"),
    (["--task", "depth"], "task: unknown 'depth'"),
    (["--task", "segmentation"], "task: no results for 'segmentation'; present: binding"),
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


def per_scene_rows(backbone: str, bits_o_given_f, *, layer: int = 0, n_layers: int = 0, val_bits: float | None = None,
                   control: str | None = None, sensitivity: float | None = None, seed: int = 0) -> dict:
    """A binding row whose β* and interval come from real per-scene bits on 60 test scenes in 20 F
    codes with H(O|F=f) = 10 bits each (the evaluator's own metric code)."""
    import numpy as np

    from evaluators.tasks.binding.metrics import Priors, binding_metrics

    h = np.full(60, 10.0)
    groups = np.repeat(np.arange(20), 3)
    bits = np.asarray(bits_o_given_f, dtype=np.float64)
    m = binding_metrics(Priors(20.0, 10.0, 10.0), {"O|F": bits}, ref_O_given_F=h, groups=groups[:, None], n_boot=500)
    row = result_row(backbone, "linear", m["beta_star"], layer=layer, n_layers=n_layers, seed=seed)
    row.update({k: m[k] for k in ("beta_star_lo", "beta_star_hi", "L_O_given_F", "H_O_given_F")})
    row.update(control=control, scene_bits_O_given_F=bits.astype(np.float32), scene_ref_O_given_F=h.astype(np.float32),
               scene_groups=groups.astype(np.int32), val_L_O_given_F=val_bits, val_H_O_given_F=10.0,
               val_L_F=0.0, val_H_F=5.0, sensitivity=sensitivity,
               sensitivity_lo=None if sensitivity is None else sensitivity - 0.1,
               sensitivity_hi=None if sensitivity is None else sensitivity + 0.1)
    return row


def test_paired_differences_rank_what_overlapping_intervals_cannot():
    """B codes every test scene 0.3 bits worse than A, whose own bits vary a lot from scene to
    scene: their marginal intervals overlap (the old rule tied them), their paired difference
    does not hold 0, so A ranks above B. C is A plus noise of either sign: it ties with A and, like
    A, beats B beyond doubt (so B ranks third)."""
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.uniform(2.0, 9.0, 60)
    rows = [per_scene_rows("A", a), per_scene_rows("B", a + 0.3), per_scene_rows("C", a + rng.normal(0, 0.5, 60))]
    board = build_leaderboard(rows)
    cells = {r.backbone: r.score for r in board.rows}
    assert cells["A"].lo <= cells["B"].hi  # the marginal intervals overlap...
    assert {r.backbone: r.rank for r in board.rows} == {"A": 1, "B": 3, "C": 1}  # ...the paired ones decide


def test_compare_leads_with_the_difference_its_interval_and_verdict(tmp_path, capsys):
    """`bench compare` at its default width prints, for every metric, the paired difference, its
    interval (lo, hi) and the verdict (they were the columns a 100-column table left out, with
    long backbone names), and says the dataset, probe and tokens choice every row shares once, in its
    title; a context that varies stays a column. JSON keeps every record whole."""
    import numpy as np

    from bench.core.numbers import readable
    from leaderboards.compare import COMPARE_COLUMNS

    a, b = "timm:vit_base_patch16_224.augreg2_in21k_ft_in1k", "hf:facebook/dinov2-with-registers-giant"
    rng = np.random.default_rng(0)
    base = rng.uniform(2.0, 9.0, 60)
    rows = []
    for backbone, shift in ((a, 0.0), (b, 0.5)):
        for probe in ("linear", "quadratic"):
            row = per_scene_rows(backbone, base + shift + rng.normal(0, 0.05, 60))
            length = row["L_O_given_F"]
            row.update(probe=probe, dataset="colorshape-balanced", B_star=10 - length, B_star_lo=9.5 - length,
                       B_star_hi=10.5 - length)
            rows.append(row)
    write_run(rows, tmp_path, "r1")
    for selection, shared, varying in ((["--probe", "linear"], ("colorshape-balanced", "linear", "cls"), ()),
                                       ([], ("colorshape-balanced", "cls"), ("linear", "quadratic"))):
        args = ["compare", a, b, "--results", tmp_path, "--metric", "beta_star", "--metric", "B_star", *selection]
        code, out, _ = run_cli([*args, "--format", "json"], capsys)
        records = json.loads(out)
        assert code == 0 and all(list(r) == list(COMPARE_COLUMNS) for r in records)
        assert len(records) == 2 * (len(varying) or 1) and {r["verdict"] for r in records} == {f"{a} better"}
        code, out, _ = run_cli(args, capsys)
        assert code == 0 and max(map(len, out.splitlines())) <= 100, out
        left_out = re.findall(r"more column\(s\): (.*) \(--wide", out)
        assert not {"difference", "lo", "hi", "verdict"} & {c for x in left_out for c in x.split(", ")}, out
        lines = [[c.strip() for c in line.strip("│").split("│")] for line in out.splitlines() if line.startswith("│")]
        assert len(lines) == len(records), out
        for r, cells in zip(records, lines):  # varying context, then the answer
            said = [r[c] for c in ("probe",) if varying] + [r["metric"], readable(r["difference"]), readable(r["lo"]),
                                                            readable(r["hi"]), "a better"]
            assert cells[:len(said)] == said, (cells, said)
        title = out.split("┏")[0]
        assert f"a = {a}" in title and f"b = {b}" in title
        for context in shared:  # once, in the title
            assert context in title and out.count(context) == 1, (context, out)


SHUFFLED = "intervene:shuffle=0.5,layer=2,subspace=sub.npz,seed=0:zoo:conjunctions"


def same_object_rows(backbone: str, per_scene, *, spec: str | None = None) -> dict:
    """An IsSameObject row whose accuracy is the mean of its per-scene values (`scene_accuracy`)."""
    import numpy as np

    v = np.asarray(per_scene, dtype=np.float64)
    row = result_row(backbone, "linear", float(v.mean()), metric="accuracy", task="issameobject", tokens="all")
    row.update(spec=spec or backbone, scene_accuracy=v)
    return row


def test_compare_pairs_every_task_with_compare_metrics_and_an_intervention_with_its_base(monkeypatch):
    """Two tasks with compare metrics are each paired on their own rows (a `task` column says which):
    binding on its per-scene bits, the other on its per-scene values; an intervened backbone with
    no `b` is compared with its base. The difference is the per-scene means' difference exactly,
    and its interval holds it and lies below 0 (every scene lost 0.1)."""
    from dataclasses import replace

    import numpy as np

    from bench.core.tasks import TASKS
    from leaderboards.compare import COMPARE_COLUMNS, compare_backbones

    monkeypatch.setitem(TASKS._entries, "issameobject", replace(TASKS.get("issameobject"), compare_metrics=("accuracy",)))
    rng = np.random.default_rng(0)
    bits, acc = rng.uniform(2.0, 9.0, 60), rng.uniform(0.6, 0.9, 40)
    rows = [per_scene_rows("zoo:conjunctions", bits), per_scene_rows(SHUFFLED, bits + 0.5),
            same_object_rows("zoo:conjunctions", acc), same_object_rows(SHUFFLED, acc - 0.1)]
    rows[1]["spec"] = SHUFFLED
    records = compare_backbones(rows, SHUFFLED, metrics=["beta_star", "accuracy"])
    assert [r["task"] for r in records] == ["binding", "issameobject"]
    assert all(list(r) == list(COMPARE_COLUMNS) for r in records)
    binding, same = records
    assert binding["b"] == pytest.approx(rows[0]["beta_star"]) and binding["a"] == pytest.approx(rows[1]["beta_star"])
    assert same["difference"] == pytest.approx(-0.1) and same["lo"] <= -0.1 <= same["hi"] < 0
    assert same["verdict"] == "zoo:conjunctions better" and binding["verdict"] == "zoo:conjunctions better"
    # by default every task's compare metrics (those the rows never computed are left out)
    for r in rows[:2]:
        r.update(dict.fromkeys(("B_star", "beta_O", "beta_F", "beta_star_paper")))
    assert {(r["task"], r["metric"]) for r in compare_backbones(rows, SHUFFLED)} >= {("issameobject", "accuracy"),
                                                                                     ("binding", "beta_star")}
    # per-scene values measured on other scenes cannot be paired: one line
    rows[3]["scene_accuracy"] = rows[3]["scene_accuracy"][:30]
    with pytest.raises(BenchError, match=r"\(issameobject\) were not measured on the same test scenes"):
        compare_backbones(rows, SHUFFLED, metrics=["accuracy"])
    with pytest.raises(BenchError, match="only an intervened backbone has a default"):
        compare_backbones(rows, "zoo:conjunctions")


def test_compare_without_b_pairs_an_intervened_backbone_with_its_base(tmp_path, capsys):
    """`bench compare INTERVENED` with no second backbone compares it with the base its spec names."""
    import numpy as np

    bits = np.random.default_rng(1).uniform(2.0, 9.0, 60)
    rows = [per_scene_rows("zoo:conjunctions", bits), per_scene_rows(SHUFFLED, bits + 0.5)]
    write_run(rows, tmp_path, "r1")
    code, out, err = run_cli(["compare", SHUFFLED, "--results", tmp_path, "--format", "json"], capsys)
    assert code == 0, err
    records = json.loads(out)
    assert records and {r["task"] for r in records} == {"binding"}
    assert all(r["verdict"] == "zoo:conjunctions better" and r["hi"] < 0 for r in records if r["metric"] == "beta_star")
    code, _, err = run_cli(["compare", "zoo:conjunctions", "--results", tmp_path], capsys)
    assert code == 2 and err.startswith("bench: error: b: name the backbone") and len(err.splitlines()) == 1


def test_a_backbone_that_reads_ground_truth_is_shown_marked_and_never_ranked(tmp_path, capsys):
    """An `intervene:inject=...` backbone is handed the objects' masks: its row is shown, labelled
    "(reads ground truth)" and unranked, however good, and it ranks no other row below it; a
    shuffled one (no ground truth) ranks as any backbone does."""
    inject = "intervene:inject=0,layer=2,subspace=sub.npz,seed=0:A"
    rows = [result_row("A", "linear", 0.50), result_row(inject, "linear", 0.95), result_row(SHUFFLED, "linear", 0.20)]
    rows[1]["spec"] = inject
    board = build_leaderboard(rows)
    by = {r.backbone: r for r in board.rows}
    assert by[inject].rank is None and by[inject].label == f"{inject} (reads ground truth)"
    assert by["A"].rank == 1 and by[SHUFFLED].rank == 2 and by[SHUFFLED].label == SHUFFLED
    assert board.rows[-1].backbone == inject  # after the ranked rows, as a control's
    write_run(rows, tmp_path, "r1")
    code, out, _ = run_cli(["leaderboard", tmp_path, "--format", "csv"], capsys)
    records = {r["backbone"]: r for r in csv.DictReader(io.StringIO(out))}
    assert code == 0 and records[inject]["rank"] == "" and records[inject]["label"].endswith("(reads ground truth)")


def test_best_layer_is_chosen_on_validation_and_reports_its_test_number():
    """Layer 2 is best on validation, layer 3 on test (a lucky test draw): `best` shows layer 2's
    test value, never layer 3's."""
    import numpy as np

    flat = np.full(60, 6.0)
    rows = [per_scene_rows("V", flat + d, layer=layer, n_layers=4, val_bits=v)
            for layer, d, v in [(1, 1.0, 7.0), (2, 0.5, 5.0), (3, 0.0, 6.0)]]
    board = build_leaderboard(rows, layer="best")
    cell = board.rows[0].cells[("linear", "cls")]
    assert cell.layer == 2 and cell.chosen_on == "validation"
    assert cell.value == pytest.approx(1 - 6.5 / 10)
    assert "best layer per cell (on validation)" in render_leaderboard(board, Format.markdown)


def test_control_rows_are_shown_apart_and_never_ranked_and_a_zero_shows_its_sensitivity():
    import numpy as np

    rng = np.random.default_rng(1)
    rows = [per_scene_rows("A", rng.uniform(2, 9, 60), sensitivity=0.9),
            per_scene_rows("A", np.full(60, 10.0), control="resampled-o", sensitivity=0.8),
            per_scene_rows("Z", np.full(60, 10.0), sensitivity=0.42)]
    board = build_leaderboard(rows)
    ranked = {(r.backbone, r.control): r.rank for r in board.rows}
    assert ranked == {("A", None): 1, ("Z", None): 2, ("A", "resampled-o"): None}
    assert board.rows[-1].label == "A (control: resampled-o)"
    text = render_leaderboard(board, Format.markdown)
    assert "| 2 | Z | 0.0 ± 0.0 <sub>s 42%</sub> |" in text  # a 0, and what this probe could have found
    assert "|  | A (control: resampled-o) | 0.0 ± 0.0 <sub>s 80%</sub> |" in text
    records = tidy_records(board)
    assert {(r["backbone"], r["control"], r["sensitivity"]) for r in records} == {
        ("A", None, 0.9), ("A", "resampled-o", 0.8), ("Z", None, 0.42)}


def test_the_table_fits_100_columns_and_never_prints_negative_zero(tmp_path, capsys):
    probes = ["linear", "quadratic", "quadratic-shared", "dnn"]
    rows = [result_row(b, p, v, tokens=t, half=0.001) for b, v in (("random:dinov2-small-reg", -0.0004),
                                                                    ("oracle:objects", 0.97))
            for p in probes for t in ("cls", "mean")]
    write_run(rows, tmp_path, "r1")
    code, out, _ = run_cli(["leaderboard", tmp_path], capsys)
    assert code == 0 and max(map(len, out.splitlines())) <= 100
    assert "random:dinov2-small-reg" in out and "0.0 ± 0.1" in out and "-0.0" not in out
    code, wide, _ = run_cli(["leaderboard", tmp_path, "--wide"], capsys)
    assert code == 0 and max(map(len, wide.splitlines())) > 100
    assert "quadratic-shared / mean" in wide and "-0.0" not in wide
    code, out, _ = run_cli(["leaderboard", tmp_path, "--format", "csv"], capsys)
    values = {(r["backbone"], r["probe"], r["tokens"]): r["value"] for r in csv.DictReader(io.StringIO(out))}
    assert float(values[("random:dinov2-small-reg", "dnn", "mean")]) == -0.0004  # csv keeps every digit


def test_issameobject_best_layer_is_chosen_on_validation_and_reports_its_test_number(tmp_path, capsys):
    """Layer 1 has the best validation accuracy, layer 3 the best test accuracy (a lucky test
    draw): `best` reports layer 1's test number, chosen on validation; rows written without
    validation numbers fall back to test and the title says so."""
    rows = [{**result_row("V", "linear", acc, metric="accuracy", task="issameobject", layer=layer, n_layers=4,
                          tokens="all"), "val_accuracy": val}
            for layer, acc, val in [(1, 0.80, 0.90), (2, 0.78, 0.85), (3, 0.95, 0.70)]]
    board = build_leaderboard(rows, task="issameobject", layer="best")
    cell = board.rows[0].cells[("linear", "all")]
    assert (cell.layer, cell.value, cell.chosen_on) == (1, pytest.approx(0.80), "validation")
    assert "best layer per cell (on validation)" in render_leaderboard(board, Format.markdown)
    write_run(rows, tmp_path, "r1")
    code, out, _ = run_cli(["leaderboard", tmp_path, "--task", "issameobject", "--format", "markdown"], capsys)
    assert code == 0 and "| 1 | V | 80.0 ± 2.0 <sub>L1</sub> |" in out
    old = [{**r, "val_accuracy": None} for r in rows]
    board = build_leaderboard(old, task="issameobject", layer="best")
    assert board.rows[0].cells[("linear", "all")].layer == 3
    assert "on test: these rows have no validation numbers" in render_leaderboard(board, Format.markdown)
