"""Plots on synthetic results: the plotted series carry the table's numbers; files are real PNG/SVG."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bench.cli import main
from bench.results import write_run
from leaderboards.plots import layer_series, sweep_series, sweep_values
from test_leaderboard import result_row


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
    assert series[("cs", "oracle:objects", ("dnn", "cls"))] == [(None, 1.0, 0.98, 1.02)]  # one reference point
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
