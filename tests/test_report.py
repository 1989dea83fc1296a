"""`bench report`: a self-contained HTML page, checked as a file and in headless Chromium."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bench.cli import main
from bench.dataset import encode_png
from bench.results import new_run_id, provenance, write_run
from evaluators.patch_labels import patch_labels
from evaluators.toy_analysis import PAIR_CATEGORIES, category_stats, write_analysis

GRID = (8, 8)
LAYERS = [0, 1, 2, 3]


def _results(results_dir: Path) -> None:
    """IsSameObject rows: two layered backbones that improve with depth, one layer-less oracle."""
    run = new_run_id()
    rows = []
    for backbone, n_layers, slope in (("random:vit-a", 3, 0.05), ("random:vit-b", 3, 0.1), ("oracle:patches", 0, 0.0)):
        for layer in range(n_layers + 1):
            for probe in ("linear", "quadratic", "majority"):
                acc = 0.5 if probe == "majority" else 0.6 + slope * layer + (0.1 if probe == "quadratic" else 0)
                acc = 0.99 if backbone.startswith("oracle") and probe == "quadratic" else acc
                rows.append({
                    **provenance(run, "cpu"), "backbone": backbone, "backbone_family": "test", "backbone_revision": "r",
                    "dataset": "cs", "dataset_fingerprint": "f" * 64, "split": "test", "layer": layer,
                    "n_layers": n_layers, "tokens": "all", "task": "issameobject", "probe": probe, "seed": 0,
                    "status": "ok", "accuracy": acc, "accuracy_lo": acc - 0.02, "accuracy_hi": acc + 0.02,
                    "majority_accuracy": 0.5,
                })
    write_run(rows, results_dir, run)


def _analysis(out: Path) -> None:
    """A toy analysis with one scene: two boxes; deeper layers separate them more sharply."""
    image = np.full((128, 128, 3), 210, np.uint8)
    mask = np.zeros((128, 128), np.uint8)
    image[16:64, 16:80], mask[16:64, 16:80] = (200, 30, 30), 1
    image[80:120, 64:120], mask[80:120, 64:120] = (30, 60, 200), 2
    labels = patch_labels(mask, GRID).ravel()
    same = labels[:, None] == labels[None, :]
    rng = np.random.default_rng(0)
    stats, maps = [], {}
    for layer in LAYERS:
        sharp = 0.1 + 0.12 * layer
        m = np.where(same, 0.5 + sharp, 0.5 - sharp)
        maps[str(layer)] = base64.b64encode(np.round(m * 255).astype(np.uint8).tobytes()).decode()
        scores = rng.random(60)
        stats += [{"layer": layer, **r} for r in category_stats(scores, np.arange(60) % len(PAIR_CATEGORIES))]
    analysis = {
        "backbone": "random:vit-a", "n_layers": 3, "layers": LAYERS, "dataset": "toys", "split": "test",
        "train_dataset": "toys", "probe": "quadratic", "grid": list(GRID), "categories": list(PAIR_CATEGORIES),
        "min_share": 0.5, "train_config": {}, "probe_val_accuracy": {}, "stats": stats,
        "scenes": [{"scene_id": "test-0000000", "image_png": base64.b64encode(encode_png(image)).decode(),
                    "labels": labels.tolist(), "scores": maps}],
    }
    write_analysis(analysis, out)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("report")
    _results(root / "results")
    _analysis(root / "toys")
    out = root / "site" / "report.html"
    assert main(["report", str(root / "results"), "--analysis", str(root / "toys"), "--out", str(out)]) == 0
    return out


def test_page_is_self_contained(report):
    page = report.read_text()
    # nothing is fetched: every src/href is inline data or an in-page anchor
    for ref in re.findall(r'(?:src|href)="([^"]*)"', page):
        assert ref.startswith("data:") or ref.startswith("#"), ref
    assert "http://" not in page and "https://" not in page
    data = json.loads(re.search(r'<script type="application/json" id="bench-data">(.*?)</script>', page, re.S).group(1))
    scene = data["analyses"][0]["scenes"][0]
    assert sorted(scene["scores"]) == ["0", "1", "2", "3"] and len(data["colormap"]) == 256
    assert data["analyses"][0]["grid"] == list(GRID)
    figures = sorted(p.name for p in report.parent.glob("*.png"))
    assert figures == ["report_issameobject_baselines.png", "report_issameobject_probes.png", "report_toys_0.png"]
    for name in figures:
        with Image.open(report.parent / name) as im:
            assert im.width > 400 and np.asarray(im.convert("L")).std() > 5  # a drawn figure, not blank
    # best layer per backbone and probe, as computed from the rows
    assert re.search(r"<td>random:vit-b</td><td>quadratic</td><td>3</td><td>1\.000</td>", page)


def test_report_needs_something_to_show(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "r.html")]) == 2
    assert "nothing to show" in capsys.readouterr().err
    assert main(["report", "--analysis", str(tmp_path / "empty"), "--out", str(tmp_path / "r.html")]) == 2
    assert "toys-analysis" in capsys.readouterr().err


# ---------------------------------------------------------------- headless Chromium

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


def _chromium(url: str, shot: Path, profile: Path) -> list[str]:
    """Load `url`, screenshot it, return the page's console messages (any message is a failure here)."""
    args = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--hide-scrollbars",
        "--virtual-time-budget=4000", "--window-size=1300,3600", f"--screenshot={shot}", url,
    ]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert shot.exists(), proc.stderr[-2000:]
    return [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian package `chromium`)")
def test_console_errors_are_seen(tmp_path):
    """The console check itself: a page that throws is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>null.x;</script></body></html>")
    messages = _chromium(bad.as_uri(), tmp_path / "bad.png", tmp_path / "profile")
    assert any("Uncaught TypeError" in m for m in messages)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian package `chromium`)")
def test_click_changes_the_heatmap_in_chromium(report, tmp_path):
    before, after, deeper = tmp_path / "before.png", tmp_path / "after.png", tmp_path / "deeper.png"
    assert _chromium(report.as_uri() + "?layer=0", before, tmp_path / "p1") == []
    # click the red box (patch row 2, col 2) at layer 0, then the same click at the last layer
    assert _chromium(report.as_uri() + "?layer=0&autoclick=0.3,0.3", after, tmp_path / "p2") == []
    assert _chromium(report.as_uri() + "?layer=3&autoclick=0.3,0.3", deeper, tmp_path / "p3") == []
    a, b, c = (np.asarray(Image.open(p).convert("RGB"), dtype=np.int16) for p in (before, after, deeper))
    assert a.shape == b.shape == c.shape
    for shot in (a, b):
        assert shot.std() > 20  # a rendered page (figures, tables, scene), not a blank one
    changed = np.abs(a - b).max(axis=2) > 30
    rows, cols = np.nonzero(changed)
    # the click recolours the scene canvas (448 x 448 px): a large block, not a stray pixel
    assert changed.sum() > 0.5 * 448 * 448
    assert 300 < cols.max() - cols.min() < 700 and 300 < rows.max() - rows.min() < 700
    # the slider's layer changes the colours again (the scores differ by layer)
    assert (np.abs(b - c).max(axis=2) > 30).sum() > 0.3 * 448 * 448
