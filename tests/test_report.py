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
from bench.core.dataset import encode_png
from bench.core.results import new_run_id, provenance, write_run
from evaluators.tasks.issameobject.patch_labels import patch_labels
from evaluators.tasks.issameobject.toy_analysis import PAIR_CATEGORIES, category_stats, write_analysis

GRID = (8, 8)
LAYERS = [0, 1, 2, 3]


def _results(results_dir: Path) -> None:
    """IsSameObject rows: two layered backbones that improve with depth, one layer-less oracle, raw
    pixels; random:vit-b's quadratic probe is planted best on validation at layer 2 (on test at 3).
    Binding rows: six backbones over twelve layers and three probes on two tokens choices."""
    from test_leaderboard import result_row

    run = new_run_id()
    rows = []
    for backbone, n_layers, slope in (("random:vit-a", 3, 0.05), ("random:vit-b", 3, 0.1), ("oracle:patches", 0, 0.0),
                                      ("pixels", 0, 0.0)):
        for layer in range(n_layers + 1):
            for probe in ("linear", "quadratic", "majority"):
                acc = 0.5 if probe == "majority" else 0.6 + slope * layer + (0.1 if probe == "quadratic" else 0)
                acc = 0.99 if backbone.startswith("oracle") and probe == "quadratic" else acc
                val = acc + (0.2 if (backbone, probe, layer) == ("random:vit-b", "quadratic", 2) else 0.0)
                rows.append({
                    **provenance(run, "cpu", "bench evaluate --task issameobject --model random:vit-a ..."),
                    "backbone": backbone, "backbone_family": "test", "backbone_revision": "r",
                    "dataset": "cs", "dataset_fingerprint": "f" * 64, "split": "test", "layer": layer,
                    "n_layers": n_layers, "tokens": "all", "task": "issameobject", "probe": probe, "seed": 0,
                    "status": "ok", "accuracy": acc, "accuracy_lo": acc - 0.02, "accuracy_hi": acc + 0.02,
                    "val_accuracy": val, "majority_accuracy": 0.5,
                    "attention_r": 0.41 if probe != "majority" and n_layers else None,
                    "attention_p": 0.002 if probe != "majority" and n_layers else None,
                })
    write_run(rows, results_dir, run)
    binding = []
    for k, backbone in enumerate(["oracle:objects", "oracle:mix-0.5", "random:dinov2-small", "random:dinov2-base",
                                  "pixels", "oracle:features"]):
        layered = backbone.startswith("random")
        for layer in range(13 if layered else 1):
            for probe in ("linear", "quadratic", "dnn"):
                for tokens in ("cls", "mean"):
                    v = max(0.0, 0.95 - 0.2 * k) * (0.5 + layer / 24 if layered else 1.0)
                    binding.append(dict(result_row(backbone, probe, v, dataset="cs-binding", tokens=tokens, layer=layer,
                                                   n_layers=12 if layered else 0, run_id="r-binding"),
                                        command=f"bench evaluate --model {backbone} --dataset data/cs-binding",
                                        sensitivity=0.6))
    write_run(binding, results_dir, "r-binding")
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
    # copies of the figures for use elsewhere go into a folder of the report's own beside the page
    assert sorted(p.name for p in report.parent.iterdir()) == [".report.html.files.json", "report.html", "report_files"]
    figures = sorted(p.name for p in (report.parent / "report_files").glob("*.png"))
    assert figures == ["binding_bars.png", "binding_layers.png", "issameobject_baselines.png",
                       "issameobject_probes.png", "toys_0.png"]
    for name in figures:
        with Image.open(report.parent / "report_files" / name) as im:
            assert 400 < im.width <= 1280 and np.asarray(im.convert("L")).std() > 5  # drawn, and fits a laptop
    # the layer is chosen on validation (2, planted), the test value shown is that layer's, with its
    # interval, beside pixels under the same probe, the majority class and the attention correlation
    assert re.search(r"<td>random:vit-b</td><td>quadratic</td><td>2</td><td>0\.900 \[0\.880, 0\.920\]</td>"
                     r"<td>0\.700</td><td>0\.500</td><td>0\.41 \(p 0\.002\)</td>", page)
    # the headline leaderboard comes first, with intervals and sensitivity; provenance names the commands
    assert page.index("Binding: β* by backbone") < page.index("IsSameObject") < page.index("Datasets and provenance")
    assert re.search(r'data-backbone="oracle:objects" data-probe="linear" data-tokens="cls"\s+data-rank="1"[^>]*>'
                     r'.*?<td class="value" data-sort="0.95">95.0</td>\s*<td>2.0</td>\s*<td data-sort=""></td>\s*'
                     r'<td data-sort="0.6">60%</td>', page, re.S)
    assert "<td>bench evaluate --model oracle:objects --dataset data/cs-binding</td>" in page
    assert "<td>ffffffffffff</td>" in page and re.search(r"<td>bench [\w.]+, numpy [\w.]+, torch [\w.+]+", page)
    # nothing is empty here, so no grey "Not shown" line; nothing is red
    assert "Not shown" not in page and "#a00" not in page


def test_empty_sections_fold_into_one_grey_line(tmp_path, capsys):
    _results(tmp_path / "results")
    out = tmp_path / "r.html"
    assert main(["report", str(tmp_path / "results"), "--out", str(out)]) == 0
    page = out.read_text()
    folded = re.findall(r'<p class="muted folded">(.*?)</p>', page)
    assert len(folded) == 1 and folded[0].startswith("Not shown: Identical objects (toys) (no --analysis")
    assert ": empty" not in page and "#a00" not in page  # no red "toys: empty" banner
    assert capsys.readouterr().err.count("not shown: ") == 1


def test_a_second_report_removes_only_its_own_stale_figures(tmp_path, capsys):
    """A report writes its page into a folder the user may keep other files in, and its figures
    into `PAGE_files/`, a folder of its own: a rerun overwrites its own figures there and removes
    one the last report drew and this one does not, through its list only; figures an older
    report drew beside the page (listed in the page's list) are removed once; the user's files,
    one named like a figure too, stay as they were."""
    _results(tmp_path / "results")
    (tmp_path / "binding-only").mkdir()
    shutil.copy(tmp_path / "results" / "r-binding.parquet", tmp_path / "binding-only")
    site = tmp_path / "site"
    site.mkdir()
    mine = {"notes.txt": b"my notes", "report_my_figure.png": b"my own figure"}
    for name, data in mine.items():
        (site / name).write_bytes(data)
    (site / "report_binding_bars.png").write_bytes(b"drawn by an older report, beside its page")
    (site / ".report.html.files.json").write_text(json.dumps({"files": ["report.html", "report_binding_bars.png"]}))
    out, figures = site / "report.html", site / "report_files"
    assert main(["report", str(tmp_path / "results"), "--out", str(out)]) == 0
    assert "removed 1 figure(s) the last report drew and this one does not: report_binding_bars.png" in (
        capsys.readouterr().err)
    assert (figures / "issameobject_probes.png").exists()
    for name in ("binding_bars.png", "binding_layers.png"):
        (figures / name).write_bytes(b"stale")
    assert main(["report", str(tmp_path / "binding-only"), "--out", str(out)]) == 0
    assert ("removed 2 figure(s) the last report drew and this one does not: issameobject_baselines.png, "
            "issameobject_probes.png") in capsys.readouterr().err
    assert sorted(p.name for p in figures.iterdir()) == [".files.json", "binding_bars.png", "binding_layers.png"]
    assert all(figures.joinpath(n).read_bytes().startswith(b"\x89PNG") for n in ("binding_bars.png", "binding_layers.png"))
    assert sorted(p.name for p in site.iterdir()) == [".report.html.files.json", "notes.txt", "report.html",
                                                      "report_files", "report_my_figure.png"]
    assert all((site / name).read_bytes() == data for name, data in mine.items())


def test_report_needs_something_to_show(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "r.html")]) == 2
    assert "nothing to show" in capsys.readouterr().err
    assert main(["report", "--analysis", str(tmp_path / "empty"), "--out", str(tmp_path / "r.html")]) == 2
    assert "toys-analysis" in capsys.readouterr().err


# ---------------------------------------------------------------- headless Chromium

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


def need_chromium() -> str:
    """The browser, or a failure (never a skip): `scripts/setup.sh` installs Debian's `chromium`."""
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: run `bash scripts/setup.sh` as root, or `apt-get install chromium`; "
                    "the report's layout is checked in a real browser", pytrace=False)
    return CHROMIUM


def _chromium(url: str, shot: Path, profile: Path) -> list[str]:
    """Load `url`, screenshot it, return the page's console messages (any message is a failure here)."""
    args = [
        need_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--hide-scrollbars",
        "--virtual-time-budget=4000", "--window-size=1300,9000", f"--screenshot={shot}", url,
    ]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert shot.exists(), proc.stderr[-2000:]
    return [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]


@pytest.mark.browser
def test_console_errors_are_seen(tmp_path):
    """The console check itself: a page that throws is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>null.x;</script></body></html>")
    messages = _chromium(bad.as_uri(), tmp_path / "bad.png", tmp_path / "profile")
    assert any("Uncaught TypeError" in m for m in messages)


@pytest.mark.browser
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


@pytest.mark.browser
def test_the_page_fits_a_1280_px_window_in_chromium(report, tmp_path):
    """What a reader sees at a laptop's width: no horizontal scrolling, no image wider than the
    window, body text of at least 12 px."""
    args = [need_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars", "--virtual-time-budget=4000",
            "--window-size=1280,900", "--dump-dom", report.as_uri() + "?measure=1"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    found = re.search(r'<pre id="measure">(.*?)</pre>', proc.stdout, re.S)
    assert found, proc.stderr[-2000:]
    m = json.loads(found.group(1).replace("&quot;", '"'))
    assert m["innerWidth"] == 1280
    assert m["scrollWidth"] <= 1280, m
    assert len(m["images"]) == 5 and all(0 < i["rendered"] <= 1280 and i["natural"] <= 1280 for i in m["images"]), m
    assert m["bodyFontPx"] >= 12 and m["minTextPx"] >= 12, m
