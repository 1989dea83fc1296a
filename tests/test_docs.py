"""The manual (docs/, built by mkdocs.yml) and the README in front of it: the site builds offline
with no warning, a broken link or anchor fails that build, the README stays a short front door
whose links land, and no page names a path outside the repository."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "benchmarks/RESULTS.md"
#: Every page the repository publishes as documentation.
PAGES = (README, RESULTS, *sorted((ROOT / "docs").rglob("*.md")))


def build(config_dir: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of the mkdocs.yml in `config_dir` into `site` (outside the checkout)."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=config_dir, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT, out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    return out


def test_the_manual_builds_with_every_page_and_nothing_fetched(site):
    built = {p.relative_to(site).with_suffix(".md") for p in site.rglob("*.html")} - {Path("404.md")}
    assert built == {p.relative_to(ROOT / "docs") for p in (ROOT / "docs").rglob("*.md")}
    # the dated measurements are benchmarks/RESULTS.md itself, not a copy that could drift
    assert (ROOT / "docs/reference/measurements.md").resolve() == RESULTS
    assert "The test suite" in (site / "reference/measurements.html").read_text()
    fetched = [p for p in site.rglob("*.html") if re.search(r'(src|href)="https?://[^"]+\.(js|css)"', p.read_text())]
    assert not fetched, f"pages that would fetch a script or a style from a network: {fetched}"


@pytest.mark.parametrize("broken", ["[a page](no-such-page.md)", "[an anchor](tutorial/quick-start.md#no-such-heading)"])
def test_a_broken_link_or_anchor_fails_the_build(broken, tmp_path):
    shutil.copy(ROOT / "mkdocs.yml", tmp_path)
    shutil.copytree(ROOT / "docs", tmp_path / "docs", symlinks=False)
    index = tmp_path / "docs/index.md"
    index.write_text(index.read_text() + f"\n{broken}\n")
    done = build(tmp_path, tmp_path / "site")
    assert done.returncode != 0 and broken.split("(")[1].rstrip(")").split("#")[-1] in done.stderr


def test_the_readme_is_a_short_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    # what it measures, install, the two commands, one study, the layout, the way into the manual
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings == ["Install", "Quick start (offline, fresh machine)", "A study", "Layout", "Documentation"]
    linked = set(re.findall(r"\]\((docs/[^)#]+)", text))
    assert linked >= {str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")} - {"docs/reference/measurements.md"}


def test_every_link_of_the_readme_lands(site):
    """The README is not part of the site, so the build does not check its links: here each
    relative link names a file, and each anchor into the manual a heading the site has."""
    for target in re.findall(r"\]\(([^)\s]+)\)", README.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), target
        if anchor:
            page = site / Path(path).relative_to("docs").with_suffix(".html")
            assert f'id="{anchor}"' in page.read_text(), target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_names_a_path_outside_the_repository(page):
    assert "../shared" not in page.read_text()
