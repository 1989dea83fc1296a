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


#: A module path as the pages name one: `evaluators/fitting/linear_solver.py`, `bench/api.py` (not a
#: path relative to a package, such as `binding/rows.py`, nor one inside another path).
MODULE_PATH = re.compile(r"(?<![\w/.-])((?:bench|evaluators|generators|leaderboards|benchmarks)/[\w/]*\.py)\b")


def missing_modules(pages: list[Path], root: Path) -> list[str]:
    """`page: path` for every module path a page names that is no file under `root`."""
    return [f"{page.relative_to(root)}: {path}" for page in pages
            for path in sorted(set(MODULE_PATH.findall(page.read_text()))) if not (root / path).is_file()]


def test_every_module_path_the_pages_name_exists():
    """A page that names `evaluators/...py` or `bench/...py` names a file the repository has: a
    module split or moved takes the pages that describe it along."""
    assert missing_modules(list(PAGES), ROOT) == []


def test_a_page_naming_a_module_that_is_gone_is_caught(tmp_path):
    (tmp_path / "evaluators" / "runner").mkdir(parents=True)
    (tmp_path / "evaluators" / "runner" / "run.py").write_text("")
    page = tmp_path / "page.md"
    page.write_text("`evaluators/runner/run.py` runs it; `evaluators/fitting.py` re-exports; "
                    "tests/evaluators/x.py and `binding/rows.py` are not module paths\n")
    assert missing_modules([page], tmp_path) == ["page.md: evaluators/fitting.py"]


ARCHITECTURE = ROOT / "docs/explanation/architecture.md"
ROOMS = ("backbones", "cache", "tasks", "probes", "fitting", "runner", "zoo")


def rooms_table(text: str) -> dict[str, set[str]]:
    """The architecture page's table of the rooms of evaluators/: room folder -> the modules its
    last column names (relative to the room; `__init__.py` only where it is named)."""
    rows = re.findall(r"^\| `(evaluators/\w+/)` \|[^|]*\|(.*)\|$", text, flags=re.M)
    return {room: set(re.findall(r"`([\w/]+\.py)`", cell)) for room, cell in rows}


def room_mismatches(text: str, root: Path) -> list[str]:
    """`room: module` for each module of a room that the table leaves out (`missing`) or names
    but the tree lacks (`gone`), and each room of evaluators/ without a row."""
    table = rooms_table(text)
    out = [f"evaluators/{room}/: no row" for room in ROOMS if f"evaluators/{room}/" not in table]
    for room, named in table.items():
        have = {p.relative_to(root / room).as_posix() for p in (root / room).rglob("*.py")}
        out += [f"{room}: missing {m}" for m in sorted(have - named) if not m.endswith("__init__.py")]
        out += [f"{room}: gone {m}" for m in sorted(named - have)]
    return out


def test_the_rooms_table_names_every_module_of_evaluators():
    """docs/explanation/architecture.md's table of rooms is the tree's: every room of evaluators/ a
    row, every module of a room in its row, and no module the tree lacks."""
    assert room_mismatches(ARCHITECTURE.read_text(), ROOT) == []


def test_a_rooms_table_out_of_step_with_the_tree_is_caught(tmp_path):
    for f in ("evaluators/cache/extract.py", "evaluators/cache/entries.py", "evaluators/tasks/binding/task.py"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    text = ("| room | what | modules |\n|---|---|---|\n| `evaluators/cache/` | the cache | `extract.py`, `old.py` |\n"
            "| `evaluators/tasks/` | tasks | `binding/task.py` |\n")
    assert room_mismatches(text, tmp_path)[:5] == [f"evaluators/{r}/: no row" for r in
                                                   ("backbones", "probes", "fitting", "runner", "zoo")]
    assert room_mismatches(text, tmp_path)[5:] == ["evaluators/cache/: missing entries.py",
                                                   "evaluators/cache/: gone old.py"]
