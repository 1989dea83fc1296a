"""The papers' published rows: the numbers as the papers print them, consistent with themselves,
shipped with the package, shown beside a user's rows and never ranked."""

from __future__ import annotations

import json

import pytest

from bench.cli import main
from leaderboards.board import build_leaderboard
from leaderboards.metrics import resolve_metric
from leaderboards.published import DATA, load_published, references_for
from bench.core.console import Format
from leaderboards.render import render_leaderboard, tidy_records
from test_leaderboard import result_row

#: "Does Object Binding Naturally Emerge ...?" (NeurIPS 2025), Table 1: accuracy (%), points over
#: the 72.6 % majority baseline, peak layer in [0, 1].
LI_TABLE_1 = {
    "facebook/dinov2-small": (86.7, 14.1, 1.00), "facebook/dinov2-base": (87.5, 14.9, 0.82),
    "facebook/dinov2-large": (90.2, 17.6, 0.78), "facebook/dinov2-giant": (88.8, 16.2, 0.77),
    "google/vit-large-patch16-224": (84.2, 11.6, 0.39), "openai/clip-vit-large-patch14": (82.9, 10.3, 0.65),
    "facebook/vit-mae-large": (76.3, 3.7, 0.13),
}
MAJORITY = 72.6
#: "Formalizing the Binding Problem" (ICML 2026), ColorShape: B_O (bits), β_O (%), B* (bits), β* (%).
BINDING_TABLE = {"linear": (5.7, 14.3, 0.3, 0.8), "quadratic": (17.9, 44.9, 12.5, 37.9),
                 "dnn": (19.4, 48.5, 13.9, 42.4), "attention": (36.8, 92.2, 31.0, 94.1)}
H_O, H_F = 39.9, 7.0


def test_each_row_is_the_published_number():
    refs = load_published()
    li = {r.model: r for r in refs if r.paper == "li2025"}
    assert {m: (r.values["accuracy"], r.values["points"], r.values["peak_layer"]) for m, r in li.items()} == LI_TABLE_1
    binding = {r.probe: r for r in refs if r.paper == "binding2026"}
    assert {p: tuple(r.values[k] for k in ("B_O", "beta_O", "B_star", "beta_star")) for p, r in binding.items()} \
        == BINDING_TABLE
    assert all(r.H == {"H_O": H_O, "H_F": H_F} for r in binding.values())
    # every row names its source and estimator; the table's [CLS] probes and the spatial attention probe
    assert all(r.source and r.estimator for r in refs)
    assert {p: r.tokens for p, r in binding.items()} == {"linear": "cls", "quadratic": "cls", "dnn": "cls",
                                                         "attention": "all"}
    assert all(r.source == "Li et al., NeurIPS 2025, Table 1" and r.probe == "quadratic" for r in li.values())


def _within_rounding(b: float, beta_pct: float, h: float, h_digits: float = 0.05) -> bool:
    """B = β·H where B, β (in %) and H are each rounded to one decimal: some unrounded triple agrees."""
    lo = (beta_pct - 0.05) / 100 * (h - h_digits)
    hi = (beta_pct + 0.05) / 100 * (h + h_digits)
    return lo - 0.05 <= b <= hi + 0.05


def test_rows_agree_with_themselves():
    for r in load_published():
        if r.paper == "li2025":
            assert round(r.values["accuracy"] - MAJORITY, 1) == r.values["points"], r
            assert 0 <= r.values["peak_layer"] <= 1
        else:
            h_o, h_o_f = r.H["H_O"], r.H["H_O"] - r.H["H_F"]  # H(O|F) = H(O) − H(F), each rounded: ±0.1
            assert _within_rounding(r.values["B_O"], r.values["beta_O"], h_o), r
            assert _within_rounding(r.values["B_star"], r.values["beta_star"], h_o_f, 0.1), r
            assert r.values["B_star"] <= r.values["B_O"]
    # the check has teeth: a β* off by a point is caught
    assert not _within_rounding(12.5, 36.9, H_O - H_F, 0.1)


def test_the_data_ships_with_the_package():
    import tomllib
    from pathlib import Path

    config = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    data = config["tool"]["setuptools"]["package-data"]["leaderboards"]
    assert "data/*.json" in data and DATA.exists()
    assert json.loads(DATA.read_text())["rows"]


def test_reference_rows_never_take_a_rank():
    """A published row far above every measured one changes no rank and takes none."""
    rows = [result_row("A", "quadratic", 0.80, task="issameobject", metric="accuracy", tokens="all"),
            result_row("B", "quadratic", 0.70, task="issameobject", metric="accuracy", tokens="all")]
    plain = build_leaderboard(rows, task="issameobject")
    board = build_leaderboard(rows, task="issameobject", reference=True)
    assert [(r.label, r.rank) for r in plain.rows] == [("A", 1), ("B", 2)]
    published = [r for r in board.rows if r.reference is not None]
    assert [(r.label, r.rank) for r in board.rows if r.reference is None] == [("A", 1), ("B", 2)]
    assert len(published) == 7 and all(r.rank is None and r.score is None for r in published)
    large = next(r for r in published if r.backbone == "DINOv2-Large")
    assert large.cells[("quadratic", "all")].value == pytest.approx(0.902)
    records = tidy_records(board)
    assert {r["source"] for r in records if r["rank"] is None} == {"Li et al., NeurIPS 2025, Table 1"}
    text = render_leaderboard(board, Format.markdown)
    assert "DINOv2-Large (published)" in text and "| 90.2 |" in text and "peak layer" in text


def test_binding_references_sit_on_the_paper_and_beta_o_boards_only():
    assert {r.probe for r in references_for(resolve_metric("beta_star_paper", "binding"))} == set(BINDING_TABLE)
    assert len(references_for(resolve_metric("beta_O", "binding"))) == 4
    assert references_for(resolve_metric("beta_star", "binding")) == []  # the anchored estimator: not the paper's
    rows = [result_row("A", "linear", 0.10, metric="beta_star_paper")]
    board = build_leaderboard(rows, metric="beta_star_paper", reference=True)
    paper = next(r for r in board.rows if r.reference is not None)
    assert paper.label == "ColorShape main table (published)"
    assert paper.cells[("attention", "all")].value == pytest.approx(0.941)
    assert ("attention", "all") in board.columns and board.rows[0].rank == 1 and paper.rank is None


def test_leaderboard_reference_option(tmp_path, capsys):
    from bench.core.results import write_run

    write_run([result_row("A", "quadratic", 0.80, task="issameobject", metric="accuracy", tokens="all")],
              tmp_path / "results", "r1")
    assert main(["leaderboard", str(tmp_path / "results"), "--task", "issameobject", "--reference",
                 "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert out.count("(published)") == 7 and "Li et al., NeurIPS 2025, Table 1" in out
    assert main(["leaderboard", str(tmp_path / "results"), "--task", "issameobject", "--format", "csv"]) == 0
    assert "(published)" not in capsys.readouterr().out


def test_the_table_with_published_rows_fits_100_columns(tmp_path, capsys):
    from bench.core.results import write_run

    rows = [result_row(b, p, v, metric="beta_star_paper", tokens=t) for b, v in (("random:dinov2-small", 0.2),
                                                                                 ("oracle:objects", 0.9))
            for p in ("linear", "quadratic", "dnn") for t in ("cls", "mean")]
    write_run(rows, tmp_path / "results", "r1")
    assert main(["leaderboard", str(tmp_path / "results"), "--metric", "beta_star_paper", "--reference"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 100
    assert "ColorShape main table (published)" in out and "(published): the papers' own numbers" in out


def test_reference_on_a_metric_no_paper_reports_says_where_they_are(tmp_path, capsys):
    from bench.core.results import write_run

    write_run([result_row("A", "linear", 0.3)], tmp_path / "results", "r1")
    assert main(["leaderboard", str(tmp_path / "results"), "--reference"]) == 0
    out = capsys.readouterr()
    assert "(published)" not in out.out
    assert " ".join(out.err.split()) == ("--reference: the papers publish no β* (beta_star); their binding numbers "
                                        "are on --metric beta_star_paper, B_star_paper, beta_O, beta_O_paper, B_O, "
                                        "B_O_paper")
