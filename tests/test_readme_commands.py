"""The README's quick start and study, the tutorial's pages and the "Your own backbone" how-to, run
as written: every command and Python block of their code, through one substitution table (local and
built-in backbones for hub ones, tiny models for big ones, tiny sizes), in a fresh working
directory, in order (the README's quick start, then the tutorial's pages in the order the manual
reads them). Set-up, the test command and `bench demo` (tests/test_demo.py runs it end to end) are
the only commands left out, and they are named here; any other command or block that does not run,
or a substitution that no longer matches the pages, fails a test."""

from __future__ import annotations

import re
import shlex
import time
from collections import defaultdict
from pathlib import Path
from typing import Mapping

import pytest

from bench.cli import main
from bench.core.results import read_results

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: The README's sections whose commands run here, in order, before the tutorial's.
SECTIONS = ("Quick start",)
#: The tutorial's pages in the order the manual reads them (mkdocs.yml's nav); every command of
#: each runs, after the README's quick start.
TUTORIAL = (ROOT / "docs/tutorial/quick-start.md", ROOT / "docs/tutorial/a-real-study.md")
#: The how-to whose three examples (a timm file, a `save_pretrained` folder, a module through
#: the Python API) run on models built by the test at the paths the page names.
OWN = ROOT / "docs/how-to/own-backbone.md"
#: The README's study (a study file and the commands that run it), the Studies how-to's too.
STUDY = "A study"
STUDIES = ROOT / "docs/how-to/studies.md"
#: Commands not run here: set-up, the test command, and `bench demo` (tests/test_demo.py runs it).
LEFT_OUT = ("bash scripts/setup.sh", "source .venv/bin/activate", "python -m pytest", "bench demo")
SMALL = "--n-train 24 --n-val 8 --n-test 8"
#: (regular expression, replacement), applied in order to each command; every one must match
#: some command, so the table cannot go stale while the pages move on.
SUBSTITUTIONS = (
    # hub backbones (no network here): DINOv2-S -> a tiny random DINOv2 checkpoint directory
    # (2 blocks, width 32: the same Hugging Face path, with attention for attention-qk; the
    # tutorial's small study runs random:dinov2-small itself), DINOv2-B-reg -> raw pixels
    (r"--model facebook/dinov2-small\b", "--model {tiny}"),
    (r"--model dinov2-small\b", "--model {tiny}"),
    (r"--model dinov2-base-reg\b", "--model pixels"),
    # tiny sizes: datasets of 40 scenes, probes of 2 epochs
    (r"--preset balanced ", f"--preset small {SMALL} --image-size 112 "),
    (r"--n-train 400 --n-val 100 --n-test 100 --image-size 128", f"{SMALL} --image-size 112"),
    (r"clevr --preset small ", "clevr --preset small --n-train 6 --n-val 3 --n-test 3 --image-size 64 "),
    (r"generate toys ", "generate toys --n-train 6 --n-val 3 --n-test 3 "),
    (r"--limit 1000\b", "--limit 16"),
    (r"^bench evaluate ", "bench evaluate --epochs 2 "),
    # your own backbone: a ViT-Ti state dict at runs/last.pth in place of a ViT-S one (the same
    # architecture in the timm-file example and the module example), probes of 2 epochs in Python
    (r"vit_small_patch16_224", "vit_tiny_patch16_224"),
    (r'probes="linear"\)', 'probes="linear", epochs=2)'),
)

_BLOCK = re.compile(r"^```([a-z]*)\n(.*?)^```", flags=re.M | re.S)


def readme_blocks(text: str, sections: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    """(language, body) of every code block under the `## ` headings that start with one of
    `sections` (None: of the whole page), in page order."""
    if sections is None:
        return _BLOCK.findall(text)
    return [block for section in re.split(r"^## ", text, flags=re.M) if section.startswith(sections)
            for block in _BLOCK.findall(section)]


def pages_blocks() -> list[tuple[str, str]]:
    """The code blocks that run in order: the README's `SECTIONS`, then every tutorial page whole."""
    return [*readme_blocks(README.read_text(), SECTIONS),
            *(block for page in TUTORIAL for block in readme_blocks(page.read_text()))]


def block_commands(block: str) -> list[str]:
    """The shell commands of one block: continuation lines joined, comments dropped, `&&` chains split."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line:
            commands += [c.strip() for c in line.split("&&")]
    return commands


def readme_commands(blocks: list[tuple[str, str]] | None = None) -> list[str]:
    """The shell commands of `blocks` (default: the README's quick start and the tutorial's
    pages; Python blocks aside), in order."""
    return [c for lang, body in (pages_blocks() if blocks is None else blocks) if lang != "python"
            for c in block_commands(body)]


def substitute(text: str, used: set[int], values: Mapping[str, str]) -> str:
    """`text` (a command or a Python block) through the substitution table; `used` collects the
    entries that matched, `values` fills their `{placeholders}` (only where they match, so each
    test passes the values of its own blocks)."""
    for k, (pattern, replacement) in enumerate(SUBSTITUTIONS):
        text, n = re.subn(pattern, lambda m, r=replacement: r.format_map(values), text, flags=re.M)
        if n:
            used.add(k)
    return text


def run_command(command: str, capsys, used: set[int], values: Mapping[str, str]) -> tuple[str, str]:
    """Run one command of the pages (through the table) in this process; its stdout and stderr, or
    a failure naming the command as written and as run."""
    assert command.startswith("bench "), f"a command of the README or the manual this test cannot run: {command!r}"
    args = shlex.split(substitute(command, used, values))
    code = main(args[1:])
    out = capsys.readouterr()
    assert code == 0, f"{command!r} (run as {shlex.join(args)!r}) exited {code}:\n{out.err[-3000:]}"
    return out.out, out.err


def test_every_substitution_matches_the_pages():
    """The table cannot go stale while the pages move on: each entry matches some block."""
    used: set[int] = set()
    for lang, body in [*pages_blocks(), *readme_blocks(OWN.read_text())]:
        for text in [body] if lang == "python" else block_commands(body):
            substitute(text, used, defaultdict(str))
    stale = [SUBSTITUTIONS[k][0] for k in range(len(SUBSTITUTIONS)) if k not in used]
    assert not stale, f"substitutions that match no command of the pages any more: {stale}"


def test_the_tutorial_list_is_every_tutorial_page_in_the_manuals_order():
    """A tutorial page added to docs/ is run here too, in the order mkdocs.yml's nav reads them."""
    assert sorted(TUTORIAL) == sorted((ROOT / "docs/tutorial").glob("*.md"))
    nav = (ROOT / "mkdocs.yml").read_text()
    assert sorted(TUTORIAL, key=lambda p: nav.index(str(p.relative_to(ROOT / "docs")))) == list(TUTORIAL)


def test_the_parser_finds_the_blocks():
    # the README's two commands, unchanged: set up and run the demo; set up and run the tests
    assert readme_commands(readme_blocks(README.read_text(), SECTIONS)) == [
        "bash scripts/setup.sh", "source .venv/bin/activate", "bench demo",
        "bash scripts/setup.sh", "source .venv/bin/activate", "python -m pytest"]
    commands = readme_commands()
    assert set(LEFT_OUT) <= set(commands)
    assert sum(c.startswith("bench ") for c in commands) >= 20, commands


@pytest.mark.slow
def test_every_quick_start_and_tutorial_command_runs_as_written(tmp_path, monkeypatch, capsys):
    from tests.test_backbones import tiny_checkpoint

    tiny = tiny_checkpoint("dinov2", tmp_path / "tiny-dinov2")[1]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    used: set[int] = set()
    ran, times = [], []
    for command in readme_commands():
        if command in LEFT_OUT:
            continue
        t0 = time.perf_counter()
        run_command(command, capsys, used, {"tiny": shlex.quote(str(tiny))})
        times.append((round(time.perf_counter() - t0, 1), command[:60]))
        ran.append(command)
    print(times)
    # what the study's commands promise is on disk
    assert len(list(Path("results").glob("*.parquet"))) == len([c for c in ran if c.startswith("bench evaluate")])
    assert Path("report.html").stat().st_size > 10_000 and Path("plots/layers.png").exists()
    assert Path("clevr.png").exists() and Path("toys.png").exists()


@pytest.mark.slow
def test_the_own_backbone_how_to_runs_as_written(tmp_path, monkeypatch, capsys):
    """The how-to's three examples, each at most 10 lines, run in page order on what the test
    puts at the paths they name: a ViT-Ti state dict at runs/last.pth, a 2-block ViT written by
    `save_pretrained` (no preprocessor config) at runs/my-vit, a 40-scene dataset at data/bcs-s."""
    import pandas as pd
    import timm
    import torch

    from tests.helpers import make_dataset
    from tests.test_own_backbones import _tiny_vit_folder

    blocks = readme_blocks(OWN.read_text())
    assert [lang for lang, _ in blocks] == ["", "", "python"], "three examples: timm file, folder, module"
    assert all(len(body.splitlines()) <= 10 for _, body in blocks)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    Path("runs").mkdir()
    torch.save(timm.create_model("vit_tiny_patch16_224", num_classes=0).state_dict(), "runs/last.pth")
    _tiny_vit_folder(Path("runs/my-vit"))
    make_dataset(Path("data/bcs-s"), preset="small", n_train=24, n_val=8, n_test=8)
    capsys.readouterr()
    used: set[int] = set()
    (timm_file, folder), python = [block_commands(body) for _, body in blocks[:2]], blocks[2][1]
    outputs = [run_command(command, capsys, used, {}) for command in timm_file + folder]
    assert "timm-file" in outputs[0][0] and "hf-folder" in outputs[2][0]
    for out, err in outputs[2:]:  # the folder's input settings, said once by each command
        assert err.count("no preprocessor_config.json; using image size 224 px (--image-size), mean [0.5") == 1
    namespace: dict = {}
    exec(compile(substitute(python, used, {}), str(OWN.relative_to(ROOT)), "exec"), namespace)
    df = namespace["df"]
    assert isinstance(df, pd.DataFrame) and set(df["backbone"]) == {"my-module"} and len(df) == 1
    shown = set(pd.concat([pd.read_parquet(f) for f in Path("results").glob("*.parquet")])["backbone"])
    assert shown == {"my-timm", "my-vit", "my-module"}


#: The study file of the README's study at test size: a tiny local DINOv2 checkpoint (2 blocks)
#: for DINOv2-S and two of its layers, the class token only, datasets of 40 scenes, probes of 2 epochs.
STUDY_SUBSTITUTIONS = (
    (r'"random:dinov2-small"', '"{tiny}"'),
    (r"layers = \[0, 6, 12\]", "layers = [1, 2]"),
    (r'tokens = \["cls", "mean"\]', 'tokens = "cls"'),
    (r"n_train = 400\nn_val = 100\nn_test = 100\nimage_size = 128", "n_train = 24\nn_val = 8\nn_test = 8\nimage_size = 112"),
    (r"^\[\[evaluate\]\].*$", "[[evaluate]]\nepochs = 2"),
)


@pytest.mark.slow
def test_the_readme_study_runs_its_study_file_as_written(tmp_path, monkeypatch, capsys):
    """The README's study file (through STUDY_SUBSTITUTIONS) and its commands, in order: the
    plan, the run, a rerun that fits nothing, the report. The Studies how-to shows the same file
    and commands."""
    from tests.test_backbones import tiny_checkpoint

    blocks = readme_blocks(README.read_text(), (STUDY,))[:2]
    assert blocks == readme_blocks(STUDIES.read_text())[:2], "the README's study is the Studies how-to's"
    (lang, study), (_, commands) = blocks
    assert lang == "toml"
    tiny = tiny_checkpoint("dinov2", tmp_path / "tiny-dinov2")[1]
    for pattern, replacement in STUDY_SUBSTITUTIONS:
        study, n = re.subn(pattern, replacement.format(tiny=tiny), study, flags=re.M)
        assert n, f"a substitution that matches the README's study no more: {pattern}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    Path("study.toml").write_text(study)
    assert [c.split()[1] for c in block_commands(commands)] == ["run", "run", "run", "report"]
    outputs = []
    for command in block_commands(commands):
        outputs.append(run_command(command, capsys, set(), {}))
        if len(outputs) == 1:  # the dry run plans, and writes nothing
            assert "to fit: 8 row sets" in outputs[0][0] and not Path("study").exists()
    # binding: 2 layers x 2 probes, 3 references x 2 probes, attention; IsSameObject: 2 layers x 4 probes,
    # less attention-qk at the last layer (no block reads it)
    assert len(read_results("study/results")) == 2 * 2 + 3 * 2 + 1 + 2 * 4 - 1
    assert "nothing to fit" in outputs[2][1]
    assert Path("report.html").stat().st_size > 10_000
