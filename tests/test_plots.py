"""Plots on synthetic results: the plotted series carry the table's numbers; files are real PNG/SVG."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bench.cli import main
from bench.core.results import write_run
from leaderboards import plots
from leaderboards.plots import layer_series, sweep_series, sweep_values
from leaderboards.board import build_leaderboard
from test_leaderboard import failed_probe_rows, result_row


def depth_rows() -> list[dict]:
    """A 4-block backbone whose dnn β* rises as 0.2·layer; an untrained one flat at 0.05; two oracles."""
    rows = []
    for layer in range(5):
        rows.append(result_row("trained", "dnn", 0.2 * layer, layer=layer, n_layers=4))
        rows.append(result_row("trained", "linear", 0.1 * layer, layer=layer, n_layers=4))
        rows.append(result_row("untrained", "dnn", 0.05, layer=layer, n_layers=4))
        rows.append(result_row("untrained", "linear", 0.01, layer=layer, n_layers=4))
    for oracle, v in (("oracle:objects", 1.0), ("oracle:features", 0.0)):
        rows += [result_row(oracle, "dnn", v), result_row(oracle, "linear", v)]
    return rows


def sweep_rows(root: Path) -> list[dict]:
    """A complexity sweep: datasets n1..n4, each with a card; β* falls as 1/n."""
    rows = []
    for n in (1, 2, 3, 4):
        (root / f"n{n}").mkdir(parents=True)
        (root / f"n{n}" / "dataset.json").write_text(json.dumps({"config": {"n_objects": n}, "splits": {"test": {}}}))
        for backbone, scale in (("trained", 1.0), ("untrained", 0.2)):
            rows.append(result_row(backbone, "dnn", scale / n, dataset=f"n{n}", fingerprint=f"fp{n}", layer=4, n_layers=4))
    return rows


def test_layer_series_holds_normalised_depth_and_values():
    board, series = layer_series(depth_rows())
    trained = series[("cs", "trained", ("dnn", "cls"))]
    assert [p[0] for p in trained] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert np.allclose([p[1] for p in trained], [0.0, 0.2, 0.4, 0.6, 0.8])
    assert np.allclose([p[3] - p[1] for p in trained], 0.02)  # interval band carried along
    assert series[("cs", "oracle:objects", ("dnn", "cls"))] == [(None, 1.0, 0.98, 1.02, False)]  # one reference point
    assert board.columns == [("linear", "cls"), ("dnn", "cls")]


def test_sweep_values_come_from_cards_and_series_follow_x(tmp_path):
    rows = sweep_rows(tmp_path)
    x = sweep_values(["n1", "n2", "n3", "n4"], tmp_path, "objects")
    assert x == {"n1": 1.0, "n2": 2.0, "n3": 3.0, "n4": 4.0}
    _, series = sweep_series(rows, x, layer="last")
    assert [(p[0], round(p[1], 6)) for p in series[("trained", ("dnn", "cls"))]] == [(1.0, 1.0), (2.0, 0.5), (3.0, round(1 / 3, 6)), (4.0, 0.25)]
    with pytest.raises(Exception, match="no 'camera_height' in its card"):
        sweep_values(["n1"], tmp_path, "camera-height")


def _check_image(png: Path) -> None:
    im = np.asarray(Image.open(png).convert("L"))
    assert im.shape[0] > 200 and im.shape[1] > 300
    assert (im < 128).mean() > 0.01  # ink, not a blank canvas


@pytest.mark.parametrize("kind, extra", [("layers", []), ("bars", ["--layer", "last"])])
def test_plot_command_writes_png_and_svg(tmp_path, capsys, kind, extra):
    write_run(depth_rows(), tmp_path / "results", "r1")
    code = main(["plot", kind, str(tmp_path / "results"), "--out", str(tmp_path / "fig" / kind), *extra])
    err = capsys.readouterr().err
    assert code == 0, err
    _check_image(tmp_path / "fig" / f"{kind}.png")
    svg = (tmp_path / "fig" / f"{kind}.svg").read_text()
    ET.fromstring(svg)  # well-formed
    assert "untrained" in svg and "oracle:objects" in svg  # every backbone is labelled


def test_sweep_plot_command(tmp_path, capsys):
    rows = sweep_rows(tmp_path / "data")
    write_run(rows, tmp_path / "results", "r1")
    args = ["plot", "sweep", str(tmp_path / "results"), "--out", str(tmp_path / "sweep.png")]
    assert main(args) == 2 and "--datasets" in capsys.readouterr().err
    assert main(args + ["--datasets", str(tmp_path / "data"), "--x", "objects"]) == 0
    _check_image(tmp_path / "sweep.png")
    assert (tmp_path / "sweep.svg").exists()
    assert main(args + ["--datasets", str(tmp_path / "data"), "--x", "height"]) == 2
    assert "x: unknown 'height'" in capsys.readouterr().err


def test_bars_of_failed_probes_are_drawn_faint_and_hatched(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, out, *formats: figures.append(fig) or [])
    plots.probe_bars(build_leaderboard(failed_probe_rows()), tmp_path / "bars")
    ax = figures[0].axes[0]
    heights = {round(p.get_height(), 1): bool(p.get_hatch()) for p in ax.patches if np.isfinite(p.get_height())}
    assert heights == {30.0: False, 40.0: False, 10.0: False, 60.0: True, -5.0: True, -6.0: True}
    assert "‡ a probe failed: not binding" in ax.get_legend_handles_labels()[1]


def test_layers_whose_probe_failed_are_crossed_out(tmp_path):
    """Layer 2's F-probe ended worse than its prior, layer 3's probes had not converged."""
    rows = [{**result_row("M", "dnn", v, layer=layer, n_layers=3, converged=converged), "B_F_hi": b_f_hi}
            for layer, v, b_f_hi, converged in [(0, 0.1, 1.0, True), (1, 0.3, 1.0, True), (2, 0.6, -0.5, True),
                                                (3, 0.7, 1.0, False)]]
    _, series = layer_series(rows)
    assert [p[4] for p in series[("cs", "M", ("dnn", "cls"))]] == [False, False, True, True]
    paper = [{**r, "beta_star_paper": 2.0, "beta_star_paper_lo": 1.5, "beta_star_paper_hi": 2.5} for r in rows]
    _, series = layer_series(paper, metric="beta_star_paper")  # L_O < L_F everywhere: every point crossed
    assert [p[4] for p in series[("cs", "M", ("dnn", "cls"))]] == [True] * 4
    (png, _) = plots.layer_curves(rows, tmp_path / "layers")
    _check_image(png)


def test_unanchored_backbones_are_labelled_in_figures(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, out, *formats: figures.append(fig) or [])
    rows = [result_row("A", "linear", 0.3), result_row("U", "linear", 0.5, prior="none", n_F_eff=None)]
    plots.probe_bars(build_leaderboard(rows), tmp_path / "bars")
    assert [t.get_text() for t in figures[0].axes[0].get_xticklabels()] == ["A", "U † unanchored"]
    plots.layer_curves(rows, tmp_path / "layers")
    legend = [t.get_text() for t in figures[1].legends[0].get_texts()]
    assert sorted(legend) == ["A", "U † unanchored"]
    rows.append(result_row("E", "linear", 0.4, prior="empirical"))  # imported real images: said so
    plots.probe_bars(build_leaderboard(rows), tmp_path / "bars")
    assert sorted(t.get_text() for t in figures[2].axes[0].get_xticklabels()) == ["A", "E † empirical",
                                                                                  "U † unanchored"]


def test_control_rows_carry_their_label_in_figures(tmp_path, monkeypatch):
    """A control row is drawn under its label, never as a second bar or line named like its backbone."""
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, out, *formats: figures.append(fig) or [])
    rows = [result_row("A", "linear", 0.3, layer=layer, n_layers=2) for layer in (1, 2)]
    rows += [{**result_row("A", "linear", 0.0, layer=layer, n_layers=2), "control": "resampled-o"} for layer in (1, 2)]
    plots.probe_bars(build_leaderboard(rows), tmp_path / "bars")
    assert [t.get_text() for t in figures[0].axes[0].get_xticklabels()] == ["A", "A (control: resampled-o)"]
    plots.layer_curves(rows, tmp_path / "layers")
    assert sorted(t.get_text() for t in figures[1].legends[0].get_texts()) == ["A", "A (control: resampled-o)"]



def ablation_rows() -> list[dict]:
    """zoo:conjunctions at 0.6 and its interventions at layer 2: shuffle of the binding subspace
    falls (0.4 at 0.5, 0.2 at 1), of a random one stays (0.58 at 1); inject rises (0.62 at α 0.5, 0.65 at 0)."""
    from bench.core.intervention_specs import intervention_spec

    rows = [result_row("zoo:conjunctions", "linear", 0.6, layer=4, n_layers=4)]
    for kind, strength, sub, value in (("shuffle", 0.5, "binding", 0.4), ("shuffle", 1.0, "binding", 0.2),
                                       ("shuffle", 1.0, "random", 0.58), ("inject", 0.5, "binding", 0.62),
                                       ("inject", 0.0, "binding", 0.65)):
        spec = intervention_spec(kind, strength, 2, f"subspaces/zoo-conjunctions-L2-{sub}-r16-s0-cs.npz",
                                 "zoo:conjunctions")
        rows.append({**result_row(spec, "linear", value, layer=4, n_layers=4), "spec": spec})
    return rows


def test_ablation_series_carry_the_rows_values_with_the_base_at_the_identity_strength():
    from leaderboards.ablation import ablation_series

    board, series = ablation_series(ablation_rows())
    col = ("linear", "cls")
    values = {k[2:4]: [(x, round(v, 9), round(lo, 9), round(hi, 9)) for x, v, lo, hi, _ in points]
              for k, points in series.items() if k[:2] == ("cs", "zoo:conjunctions") and k[4] == col}
    assert values == {
        ("shuffle", "binding"): [(0.0, 0.6, 0.58, 0.62), (0.5, 0.4, 0.38, 0.42), (1.0, 0.2, 0.18, 0.22)],
        ("shuffle", "random"): [(0.0, 0.6, 0.58, 0.62), (1.0, 0.58, 0.56, 0.6)],
        ("inject", "binding"): [(0.0, 0.65, 0.63, 0.67), (0.5, 0.62, 0.6, 0.64), (1.0, 0.6, 0.58, 0.62)],
    }


def test_ablation_plot_writes_png_and_svg_with_a_line_per_backbone_kind_and_subspace(tmp_path, capsys):
    write_run(ablation_rows(), tmp_path / "results", "r1")
    code = main(["plot", "ablation", str(tmp_path / "results"), "--out", str(tmp_path / "fig" / "ablation")])
    assert code == 0, capsys.readouterr().err
    _check_image(tmp_path / "fig" / "ablation.png")
    svg = (tmp_path / "fig" / "ablation.svg").read_text()
    ET.fromstring(svg)
    for label in ("shuffle · binding subspace", "shuffle · random subspace", "inject · binding subspace"):
        assert label in svg  # the legend: a line per kind and subspace kind
    assert "zoo:conjunctions · " in svg  # a panel per base backbone and dataset
