"""The README's quick start and study, run as written: every command of their code blocks,
through one substitution table (local and built-in backbones for hub ones, tiny sizes), in a fresh
working directory, in README order. Set-up, the test command and `bench demo` (which CI runs
as itself) are the only commands left out, and they are named here; any other command that
does not run, or a substitution that no longer matches the README, fails the test."""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path


from bench.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
SECTIONS = ("Quick start", "A real study")
#: Commands not run here: set-up, the test command, and `bench demo` (CI runs it in full).
LEFT_OUT = ("bash scripts/setup.sh", "source .venv/bin/activate", "python -m pytest", "bench demo")
SMALL = "--n-train 24 --n-val 8 --n-test 8"
#: (regular expression, replacement), applied in order to each command; every one must match
#: some command, so the table cannot go stale while the README moves on.
SUBSTITUTIONS = (
    # hub backbones (no network here): DINOv2-S -> a tiny random DINOv2 checkpoint directory
    # (2 blocks, width 32: the same Hugging Face path, with attention for attention-qk; the
    # README's small study runs random:dinov2-small itself), DINOv2-B-reg -> raw pixels
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
)


def readme_commands(text: str) -> list[str]:
    """The shell commands of the code blocks under the README's quick start and study headings,
    continuation lines joined, comments dropped, `&&` chains split, in order."""
    commands = []
    for section in re.split(r"^## ", text, flags=re.M):
        if not section.startswith(SECTIONS):
            continue
        for block in re.findall(r"^```[a-z]*\n(.*?)^```", section, flags=re.M | re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                if line:
                    commands += [c.strip() for c in line.split("&&")]
    return commands


def substitute(command: str, used: set[int], **values: str) -> str:
    for k, (pattern, replacement) in enumerate(SUBSTITUTIONS):
        command, n = re.subn(pattern, replacement.format(**values).replace("\\", "\\\\"), command)
        if n:
            used.add(k)
    return command


def test_the_readme_parser_finds_the_blocks():
    commands = readme_commands(README.read_text())
    assert set(LEFT_OUT) <= set(commands)
    assert sum(c.startswith("bench ") for c in commands) >= 20, commands


def test_every_quick_start_and_study_command_runs_as_written(tmp_path, monkeypatch, capsys):
    from tests.test_backbones import tiny_checkpoint

    tiny = tiny_checkpoint("dinov2", tmp_path / "tiny-dinov2")[1]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    used: set[int] = set()
    ran, times = [], []
    for command in readme_commands(README.read_text()):
        if command in LEFT_OUT:
            continue
        assert command.startswith("bench "), f"a README command this test cannot run: {command!r}"
        args = shlex.split(substitute(command, used, tiny=shlex.quote(str(tiny))))
        t0 = time.perf_counter()
        code = main(args[1:])
        out = capsys.readouterr()
        times.append((round(time.perf_counter() - t0, 1), command[:60]))
        assert code == 0, f"{command!r} (run as {shlex.join(args)!r}) exited {code}:\n{out.err[-3000:]}"
        ran.append(command)
    stale = [SUBSTITUTIONS[k][0] for k in range(len(SUBSTITUTIONS)) if k not in used]
    assert not stale, f"substitutions that match no README command any more: {stale}"
    print(times)
    # what the study's commands promise is on disk
    assert len(list(Path("results").glob("*.parquet"))) == len([c for c in ran if c.startswith("bench evaluate")])
    assert Path("report.html").stat().st_size > 10_000 and Path("plots/layers.png").exists()
    assert Path("clevr.png").exists() and Path("toys.png").exists()


def test_your_own_backbone_section_runs_as_written(tmp_path, monkeypatch, capsys):
    """The README's `py:` example: its Python block saved under the name its first line gives,
    then its commands, on a 40-scene dataset in the place the study's commands make it."""
    from tests.conftest import make_dataset

    section = next(s for s in re.split(r"^## ", README.read_text(), flags=re.M) if s.startswith("Your own backbone"))
    python, shell = re.findall(r"^```python\n(.*?)^```", section, flags=re.M | re.S), readme_commands(
        "## Quick start\n" + re.sub(r"^```python\n.*?^```", "", section, flags=re.M | re.S))
    assert len(python) == 1 and len(python[0].splitlines()) <= 10 and len(shell) == 2
    monkeypatch.chdir(tmp_path)
    Path(python[0].splitlines()[0].removeprefix("# ")).write_text(python[0])
    make_dataset(tmp_path / "data" / "bcs-s", preset="small", n_train=24, n_val=8, n_test=8)
    outputs = []
    for command in shell:
        args = shlex.split(command + (" --epochs 2" if command.startswith("bench evaluate") else ""))
        code = main(args[1:])
        outputs.append(capsys.readouterr())
        assert code == 0, f"{command!r} exited {code}:\n{outputs[-1].err[-3000:]}"
    assert "py-file" in outputs[0].out and "sha256:" in outputs[0].out
    import pandas as pd

    (results,) = Path("results").glob("*.parquet")
    assert set(pd.read_parquet(results)["backbone"]) == {"mine"}
