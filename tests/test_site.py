"""`bench site`: one board behind every view, the site's pages and links as files, and the pages
in a real browser (Chromium through Selenium: sorting, filtering, layout at 1,280 px, nothing
fetched from a network)."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
import pytest

from bench import api
from bench.cli import main
from bench.core.dataset import Dataset
from bench.core.results import write_run
from test_leaderboard import per_scene_rows, result_row

FP = "f" * 64


def board_rows() -> list[dict]:
    """Three layered backbones on 60 test scenes with per-scene bits (so ranks and `compare` are
    paired) and validation numbers that choose a layer other than the test's best, and a control."""
    rng = np.random.default_rng(0)
    base = rng.uniform(2.0, 9.0, 60)
    rows = []
    for backbone, shift in (("A", 0.0), ("B", 0.4), ("C", 2.0)):
        for layer, d, val in ((1, 0.6, 7.0), (2, 0.3, 5.0), (3, 0.0, 6.0)):  # layer 2 wins on validation
            rows.append(per_scene_rows(backbone, base + shift + d + rng.normal(0, 0.05, 60), layer=layer,
                                       n_layers=3, val_bits=val + shift, sensitivity=0.7))
    rows.append(per_scene_rows("A", np.full(60, 10.0), layer=3, n_layers=3, val_bits=9.9, control="resampled-o",
                               sensitivity=0.7))
    for r in rows:
        r.update(dataset="cs", dataset_fingerprint=FP, command="bench evaluate --model X --dataset data/cs")
    return rows


class _Rows(HTMLParser):
    """Every board row (`<tr data-backbone=...>`) of a page, by the board it belongs to."""

    def __init__(self) -> None:
        super().__init__()
        self.boards: dict[str, list[dict[str, str]]] = {}
        self.board: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and "data-board" in a:
            self.board = a["data-board"]
            self.boards[self.board] = []
        elif tag == "tr" and self.board and "data-backbone" in a:
            self.boards[self.board].append(a)


def page_boards(path: Path) -> dict[str, list[dict[str, str]]]:
    parser = _Rows()
    parser.feed(path.read_text())
    return parser.boards


def _cells(trs: list[dict[str, str]]) -> dict[tuple, tuple]:
    return {(t["data-backbone"], t["data-probe"], t["data-tokens"]):
            (round(float(t["data-value"]), 9), int(t["data-layer"]), int(t["data-rank"]) if t["data-rank"] else None)
            for t in trs}


def test_one_board_feeds_leaderboard_compare_report_and_site(tmp_path, capsys):
    write_run(board_rows(), tmp_path / "results", "r1")
    assert main(["leaderboard", str(tmp_path / "results"), "--format", "csv"]) == 0
    records = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    terminal = {(r["label"], r["probe"], r["tokens"]): (round(float(r["value"]), 9), int(r["layer"]),
                                                         int(r["rank"]) if r["rank"] else None) for r in records}
    # the board: layer 2 chosen on validation everywhere, A and B ahead of C, the control labelled and unranked
    assert terminal[("A", "linear", "cls")][1:] == (2, 1) and terminal[("C", "linear", "cls")][2] == 3
    assert terminal[("A (control: resampled-o)", "linear", "cls")][1:] == (3, None)

    assert main(["compare", "A", "C", "--results", str(tmp_path / "results"), "--metric", "beta_star",
                 "--format", "json"]) == 0
    (pair,) = json.loads(capsys.readouterr().out)
    assert (round(pair["a"], 9), pair["a_layer"]) == terminal[("A", "linear", "cls")][:2]
    assert (round(pair["b"], 9), pair["b_layer"]) == terminal[("C", "linear", "cls")][:2]
    assert pair["verdict"] == "A better"

    assert main(["report", str(tmp_path / "results"), "--out", str(tmp_path / "report.html")]) == 0
    assert _cells(page_boards(tmp_path / "report.html")["binding"]) == terminal

    assert main(["site", str(tmp_path / "results"), "-o", str(tmp_path / "site")]) == 0
    boards = page_boards(tmp_path / "site" / "index.html")
    assert _cells(boards["cs--binding--beta_star"]) == terminal
    # the paired matrix says what compare says: A − C beyond 0, in green
    matrix = (tmp_path / "site" / "compare.html").read_text()
    diff = f"{pair['difference'] * 100:+.1f} [{pair['lo'] * 100:+.1f}, {pair['hi'] * 100:+.1f}]"
    assert f'<td class="better">{diff}</td>' in matrix


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """Two results folders: the second re-measures one key later (it wins), measures `cs` again on
    other data (a second board) and holds a --limit trial (kept apart); IsSameObject rows beside the
    binding ones; a dataset folder for `cs-tiny`'s page; a toy analysis."""
    from test_report import _analysis, _results

    root = tmp_path_factory.mktemp("site")
    ds = api.generate("colorshape", out=root / "data" / "cs-tiny", n_train=4, n_val=4, n_test=4, workers=1)
    tiny_fp = Dataset(ds).fingerprint("test")
    _results(root / "one")
    write_run(board_rows(), root / "one", "r-board")
    later = "2027-01-01T00:00:00+00:00"
    second = [
        {**result_row("A", "linear", 0.61, dataset="cs", fingerprint=FP, layer=2, n_layers=3, created_at=later),
         "command": "bench evaluate"},
        result_row("A", "linear", 0.33, dataset="cs", fingerprint="0" * 64),
        result_row("B", "linear", 0.31, dataset="cs", fingerprint="0" * 64),
        result_row("A", "linear", 0.99, dataset="cs-binding", fingerprint="1" * 64, limit=10),
        result_row("evil<script>alert(1)</script>", "linear", 0.2, dataset="cs-tiny", fingerprint=tiny_fp),
    ]
    write_run(second, root / "two", "r-two")
    _analysis(root / "toys")
    out = root / "site"
    assert main(["site", str(root / "one"), str(root / "two"), "-o", str(out), "--datasets", str(root / "data"),
                 "-a", str(root / "toys")]) == 0
    return out


def test_site_pages_boards_and_published_rows(site):
    index = (site / "index.html").read_text()
    boards = page_boards(site / "index.html")
    # a dataset name on two fingerprints: two datasets; the --limit trial is set aside
    assert {b.split("--")[0] for b in boards} == {"cs-data-ffffffffffff", "cs-data-000000000000", "cs-binding",
                                                  "cs-tiny"}
    assert "(limit 10)" not in index and "1 binding rows on cs-binding (--limit 10; --include-limited shows it)" in index
    # the newest row per key wins across folders: A's linear cell at layer 2 is the second folder's
    a = next(t for t in boards["cs-data-ffffffffffff--binding--beta_star"]
             if t["data-backbone"] == "A" and t["data-probe"] == "linear")
    assert float(a["data-value"]) == 0.61
    # a board per metric the rows hold (these hold β* and IsSameObject accuracy only)
    assert {b.split("--", 1)[1] for b in boards if b.startswith("cs-data-f")} == {
        "binding--beta_star", "issameobject--accuracy"}
    # published rows beside the accuracy board, never ranked; the control labelled
    acc = boards["cs-data-ffffffffffff--issameobject--accuracy"]
    published = [t for t in acc if "published" in t["class"]]
    assert len(published) == 7 and all(t["data-rank"] == "" for t in published)
    assert any(t["data-backbone"] == "DINOv2-Large (published)" and float(t["data-value"]) == 0.902
               for t in published)
    control = [t for t in boards["cs-data-ffffffffffff--binding--beta_star"] if "control" in t["class"]]
    assert control and all(t["data-backbone"] == "A (control: resampled-o)" and t["data-rank"] == "" for t in control)
    # names are escaped, never markup
    assert "<script>alert(1)" not in index and "evil&lt;script&gt;alert(1)&lt;/script&gt;" in index
    page = (site / "backbone-A.html").read_text()
    assert "A (control: resampled-o)" in page and 'class="chosen"' in page and "70% [60%, 80%]" in page


def test_dataset_pages_show_card_priors_and_preview(site):
    tiny = (site / "dataset-cs-tiny.html").read_text()
    assert "preview sheet of cs-tiny" in tiny and "Generator settings" in tiny
    assert (site / "fig-dataset-cs-tiny-preview.png").stat().st_size > 1000
    other = (site / "dataset-cs-binding.html").read_text()
    assert "Not given" in other and "--datasets DIR" in other
    assert "H(O|F)" in other


def _links(page: Path) -> list[str]:
    return re.findall(r'(?:src|href)="([^"]*)"', page.read_text())


def test_every_internal_link_and_image_resolves(site):
    pages = sorted(site.glob("*.html"))
    assert {"index.html", "compare.html", "provenance.html", "toys.html"} <= {p.name for p in pages}
    ids = {p.name: set(re.findall(r'id="([^"]+)"', p.read_text())) for p in pages}
    checked = 0
    for page in pages:
        for ref in _links(page):
            assert not ref.startswith(("http:", "https:", "//")), (page.name, ref)  # nothing from a network
            if ref.startswith("data:"):
                continue
            target, _, anchor = ref.partition("#")
            target = unquote(urlsplit(target).path) or page.name
            assert (site / target).is_file(), (page.name, ref)
            if anchor:
                assert anchor in ids[target], (page.name, ref)
            checked += 1
    assert checked > 50


def test_a_rebuild_removes_only_what_the_last_build_wrote(tmp_path, capsys):
    """A site's folder is its own (hostile inputs: a folder of the user's is refused): a rebuild
    writes its pages again and removes the pages of a backbone no longer in the results."""
    write_run(board_rows(), tmp_path / "results", "r1")
    write_run([r for r in board_rows() if r["backbone"] != "C"], tmp_path / "without-c", "r1")
    out = tmp_path / "site"
    assert main(["site", str(tmp_path / "results"), "-o", str(out)]) == 0
    (out / "backbone-A.html").unlink()
    assert main(["site", str(tmp_path / "results"), "-o", str(out)]) == 0
    assert (out / "backbone-A.html").exists() and (out / "backbone-C.html").exists()
    assert main(["site", str(tmp_path / "without-c"), "-o", str(out)]) == 0
    assert (out / "backbone-A.html").exists() and not list(out.glob("*-C*"))
    assert "removed 2 the last build wrote" in capsys.readouterr().err
    assert main(["site", str(tmp_path / "nowhere"), "-o", str(out)]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_a_site_builds_around_a_plot_it_cannot_draw(tmp_path, capsys):
    """Rows whose metric is NaN at every layer (a fit that diverged) leave nothing to draw: the
    backbone's page says so in one line where its figure would be, and every other page and figure
    is written (the site once stopped at "plot: no results to draw for this selection")."""
    nan = float("nan")
    rows = [result_row("A", "linear", nan, layer=layer, n_layers=3) for layer in (1, 2, 3)]
    rows += [result_row("B", "linear", 0.3 + 0.1 * layer, layer=layer, n_layers=3) for layer in (1, 2, 3)]
    write_run(rows, tmp_path / "results", "r1")
    assert main(["site", str(tmp_path / "results"), "-o", str(tmp_path / "site")]) == 0
    assert "no results to draw" not in capsys.readouterr().err
    site = tmp_path / "site"
    assert {"index.html", "backbone-A.html", "backbone-B.html", "dataset-cs.html", "compare.html",
            "provenance.html"} <= {p.name for p in site.glob("*.html")}
    a = (site / "backbone-A.html").read_text()
    assert '<img class="figure"' not in a
    assert '<p class="muted">No figure: no layer of A has a β* value to draw on cs.</p>' in a
    b = (site / "backbone-B.html").read_text()
    (figure,) = re.findall(r'<img class="figure" alt="[^"]*" src="([^"]+)"', b)
    assert (site / figure).stat().st_size > 1000


def test_a_dataset_page_shows_its_ablation_figure(tmp_path, capsys):
    """Results with intervened backbones: the dataset's page shows the headline metric against
    intervention strength, a PNG the site wrote and lists in its manifest; without any, no such section."""
    from test_plots import ablation_rows

    write_run(ablation_rows(), tmp_path / "results", "r1")
    assert main(["site", str(tmp_path / "results"), "-o", str(tmp_path / "site")]) == 0, capsys.readouterr().err
    page = (tmp_path / "site" / "dataset-cs.html").read_text()
    (figure,) = re.findall(r'<img class="figure" alt="binding: β\* against intervention strength" src="([^"]+)"', page)
    assert figure == "fig-dataset-cs-ablation-binding.png" and (tmp_path / "site" / figure).stat().st_size > 1000
    assert figure in (tmp_path / "site" / ".index.html.files.json").read_text()
    write_run([result_row("A", "linear", 0.3)], tmp_path / "plain", "r1")
    assert main(["site", str(tmp_path / "plain"), "-o", str(tmp_path / "site2")]) == 0
    assert "Under ablation" not in (tmp_path / "site2" / "dataset-cs.html").read_text()


# ---------------------------------------------------------------- Chromium through Selenium

def need_browser():
    """A headless Chromium through chromedriver, or a failure (never a skip): `scripts/setup.sh`
    installs Debian's `chromium` and `chromium-driver`, and Selenium comes with the `dev` extra."""
    try:
        from selenium import webdriver
    except ImportError:
        pytest.fail("selenium is not installed: pip install -e '.[dev]'", pytrace=False)
    chromium = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
                    None)
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.fail("chromium and chromium-driver are not installed: run `bash scripts/setup.sh` as root, or "
                    "`apt-get install chromium chromium-driver`; the site is checked in a real browser", pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900", "--hide-scrollbars",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--host-resolver-rules=MAP * ~NOTFOUND"):  # no name resolves: no network
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    from selenium.webdriver.chrome.service import Service

    return webdriver.Chrome(options=options, service=Service(driver))


@pytest.fixture(scope="module")
def browser():
    driver = need_browser()
    yield driver
    driver.quit()


def _visible(driver, board: str) -> list[tuple[str, str, float]]:
    return driver.execute_script(
        "return [...document.querySelectorAll(`table[data-board='${arguments[0]}'] tbody tr`)]"
        ".filter(tr => !tr.hidden && tr.offsetParent !== null)"
        ".map(tr => [tr.dataset.backbone, tr.dataset.probe, tr.dataset.value === '' ? null : Number(tr.dataset.value)])",
        board)


@pytest.mark.browser
def test_a_click_on_a_column_header_sorts_and_a_filter_hides_rows(site, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get((site / "index.html").as_uri())
    board = "cs-binding--binding--beta_star"
    before = _visible(browser, board)
    header = browser.find_element(By.CSS_SELECTOR, f"table[data-board='{board}'] th:nth-child(5)")  # β* (%)
    header.click()
    desc = _visible(browser, board)
    values = [v for _, _, v in desc if v is not None]
    assert values == sorted(values, reverse=True) and sorted(desc, key=str) == sorted(before, key=str)
    header.click()
    asc = [v for _, _, v in _visible(browser, board) if v is not None]
    assert asc == sorted(asc) and asc != values
    browser.find_element(By.CSS_SELECTOR, f"table[data-board='{board}'] th:nth-child(2)").click()  # backbone
    names = [b for b, _, _ in _visible(browser, board)]
    assert names == sorted(names)

    Select(browser.find_element(By.ID, "filter-probe")).select_by_value("dnn")
    shown = _visible(browser, board)
    assert shown and {p for _, p, _ in shown} == {"dnn"} and len(shown) < len(before)
    Select(browser.find_element(By.ID, "filter-tokens")).select_by_value("mean")
    assert {p for _, p, _ in _visible(browser, board)} == {"dnn"} and len(_visible(browser, board)) == len(shown) // 2
    Select(browser.find_element(By.ID, "filter-probe")).select_by_value("")
    Select(browser.find_element(By.ID, "filter-tokens")).select_by_value("")
    assert len(_visible(browser, board)) == len(before)


MEASURE = """
const px = (e) => parseFloat(getComputedStyle(e).fontSize);
const text = [...document.querySelectorAll("body *")].filter((e) =>
  e.offsetParent !== null && [...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim()));
return {inner: window.innerWidth, scroll: document.documentElement.scrollWidth,
        body: document.body.scrollWidth, minText: Math.min(...text.map(px)),
        small: text.filter((e) => px(e) < 12).slice(0, 3).map((e) => e.tagName + ": " + e.textContent.slice(0, 40)),
        images: [...document.images].map((i) => [i.getAttribute("src").slice(0, 60), i.complete && i.naturalWidth > 0]),
        fetched: performance.getEntriesByType("resource").map((r) => r.name)
                   .filter((n) => !n.startsWith("file:") && !n.startsWith("data:"))};
"""


@pytest.mark.browser
def test_every_page_fits_1280_px_reads_at_12_px_and_loads_from_disk_alone(site, browser):
    """At a 1,280-px window no page scrolls sideways (wide tables scroll in their own box), no text is
    under 12 px, every image decodes, nothing is fetched but files of the site, and the console is quiet."""
    pages = sorted(site.glob("*.html"))
    for page in pages:
        browser.get(page.as_uri())
        m = browser.execute_script(MEASURE)
        assert m["inner"] == 1280 and m["scroll"] <= 1280 and m["body"] <= 1280, (page.name, m)
        assert m["minText"] >= 12, (page.name, m["small"])
        assert all(ok for _, ok in m["images"]), (page.name, m["images"])
        assert m["fetched"] == [], (page.name, m["fetched"])
        errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
        assert errors == [], (page.name, errors)
    assert len(pages) >= 10


LISTS = """
const boxes = (e) => [...e.getClientRects()].filter((r) => r.width > 0 && r.height > 0);
const page = document.querySelector(".cols").getBoundingClientRect();
const items = [...document.querySelectorAll(".cols li")].map((li, k) => {
  const a = li.querySelector("a");
  return {k, list: li.closest("div").querySelector("h2").textContent, text: a.textContent, rects: boxes(a),
          em: parseFloat(getComputedStyle(li).fontSize), li: li.getBoundingClientRect()};
});
// two links on one line stand at least 1.5 em apart: room for the right one's bullet, which sits
// outside its text (in the gap), and a space a reader sees
const close = [];
for (const x of items) for (const y of items) if (x.k !== y.k)
  for (const p of x.rects) for (const q of y.rects)
    if (p.top < q.bottom - 0.5 && q.top < p.bottom - 0.5 && p.left <= q.left && q.left - p.right < 1.5 * y.em)
      close.push([x.text, y.text, Math.round(q.left - p.right)]);
return {n: items.length, lists: [...new Set(items.map((x) => x.list))], close: close.slice(0, 5),
        overflow: items.filter((x) => x.li.right > page.right + 0.5
                                      || x.rects.some((r) => r.right > x.li.right + 0.5 || r.left < x.li.left - 0.5))
                       .map((x) => x.text)};
"""


@pytest.mark.browser
def test_the_index_lists_do_not_overlap_at_1280_px(tmp_path, browser):
    """The index's lists of backbones, datasets and boards at a 1,280-px window: no link runs out of
    its list item, and two links on one line stand apart, the right one's bullet between them (the
    boards' two columns once ran "ds: β*_paper" into the bullet of "ds: β_F"); and a name that
    cannot break at all, wider than a column, still stays in its column."""
    rows = []
    unbreakable = "clevr_occlusion_sweep_camera_height_3p2_seed_0_n_test_2000_image_size_224_mean_visibility_0p5"
    for ds in (unbreakable, "colorshape-balanced-small"):  # the long one first, its β*_paper beside the gap
        for backbone in ("facebook/dinov2-with-registers-giant", "openai/clip-vit-large-patch14-336"):
            row = result_row(backbone, "linear", 0.3, dataset=ds, fingerprint=ds)
            for metric in ("beta_star_paper", "beta_O", "beta_F"):
                row.update({metric: 0.2, f"{metric}_lo": 0.1, f"{metric}_hi": 0.3})
            rows.append(row)
    write_run(rows, tmp_path / "results", "r1")
    assert main(["site", str(tmp_path / "results"), "-o", str(tmp_path / "site")]) == 0
    browser.get((tmp_path / "site" / "index.html").as_uri())
    m = browser.execute_script(LISTS)
    assert m["lists"] == ["Backbones", "Datasets", "Boards"] and m["n"] == 2 + 2 + 8, m
    assert m["close"] == [], m["close"]
    assert m["overflow"] == [], m["overflow"]
