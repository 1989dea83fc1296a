"""`bench generate/info/generators/preview`: priors reported, determinism, resume, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from bench.cli import main
from bench.core.dataset import CARD_NAME, Dataset

BENCH = [sys.executable, "-c", "from bench.cli import main; main()"]


def run(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_generate_then_info_reports_paper_priors(tmp_path, capsys):
    d = tmp_path / "bal"
    code, _, err = run(["generate", "colorshape", "--preset", "balanced", "--out", d,
                        "--n-train", 12, "--n-val", 6, "--n-test", 6], capsys)
    assert code == 0, err
    code, out, _ = run(["info", d, "--format", "json"], capsys)
    card = json.loads(out)
    test = card["splits"]["test"]
    assert (round(test["H_O"], 2), round(test["H_F"], 2), round(test["H_O_given_F"], 2)) == (39.94, 7.03, 32.91)
    assert [card["splits"][s]["n_F_codes"] for s in ("train", "val", "test")] == [522, 131, 131]
    assert card["generator"] == {"name": "colorshape", "version": "1.0"}
    assert card["config"]["n_objects"] == 18 and card["seed"] == 0
    code, out, _ = run(["info", d], capsys)
    assert code == 0 and "39.94" in out and "32.91" in out


def test_determinism_across_worker_counts(tmp_path, capsys):
    args = ["generate", "colorshape", "--preset", "small", "--n-train", 30, "--n-val", 10, "--n-test", 10,
            "--set", "shard_size=8", "--seed", 7]
    assert run([*args, "--out", tmp_path / "w1", "--workers", 1], capsys)[0] == 0
    assert run([*args, "--out", tmp_path / "w2", "--workers", 2], capsys)[0] == 0
    files1 = sorted(p.name for p in (tmp_path / "w1").iterdir())
    assert files1 == sorted(p.name for p in (tmp_path / "w2").iterdir())
    assert len([f for f in files1 if f.endswith(".parquet")]) == 4 + 2 + 2
    for name in files1:
        assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes(), name
    # another seed gives other scenes
    assert run([*args[:-1], 8, "--out", tmp_path / "s8"], capsys)[0] == 0
    fp = lambda d: Dataset(d).fingerprint("test")  # noqa: E731
    assert fp(tmp_path / "s8") != fp(tmp_path / "w1")


#: `bench generate` whose process stops collecting its workers' shards after the first two: it stays
#: mid-run (its workers idle once their queued shards are written) until it is killed.
STALLED_GENERATE = """
import time
import generators.engine as engine
from bench.cli import main

wait, collected = engine.wait, []
def stalled(futures, **kwargs):
    if len(collected) >= 2:
        time.sleep(600)
    done, not_done = wait(futures, **kwargs)
    collected.extend(done)
    return done, not_done
engine.wait = stalled
main()
"""


@pytest.mark.slow
def test_killed_run_leaves_no_dataset_and_resumes(tmp_path, capsys):
    """A run killed (with its workers) part way: no dataset, and the same command completes it. The
    run stalls after two shards, so the kill lands mid-run whatever the machine's speed."""
    d = tmp_path / "killed"
    args = ["generate", "colorshape", "--preset", "small", "--n-train", "1000", "--n-val", "10", "--n-test", "10",
            "--set", "shard_size=50", "--workers", "2", "--out", str(d)]
    proc = subprocess.Popen([sys.executable, "-c", STALLED_GENERATE, *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300  # a hang guard: two shards take seconds
    while len(list(d.glob("train-*.parquet"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "the run wrote no two shards"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 2 <= len(list(d.glob("train-*.parquet"))) < 20
    assert not (d / CARD_NAME).exists()
    with pytest.raises(Exception, match="no dataset.json"):
        Dataset(d)
    assert run(args, capsys)[0] == 0  # same command resumes
    fresh = tmp_path / "fresh"
    assert run([*args[:-1], str(fresh)], capsys)[0] == 0
    assert Dataset(d).card["splits"] == {
        s: {**v} for s, v in Dataset(fresh).card["splits"].items()
    }
    assert not list(d.glob(".*"))  # no temp files or markers left


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--set", "n_objects=40"], "n_objects: 40 cannot cover"),
        (["--set", "n_colors=0"], "n_colors: must be 1..8"),
        (["--set", "colors_per_scene=9"], "colors_per_scene"),
        (["--image-size", "-5"], "image_size: must be > 0"),
        (["--set", "object_size=300"], "object_size"),
        (["--set", "object_size=40", "--set", "colors_per_scene=6", "--set", "n_objects=30"], "do not fit"),
        (["--preset", "nope"], "preset: unknown 'nope'"),
        (["--set", "colour=red"], "colour: unknown parameter"),
        (["--set", "n_objects=many"], "n_objects: cannot read 'many'"),
        (["--n-train", "-1"], "n_train: must be ≥ 0"),
        (["--set", "overlap=sometimes"], "overlap: unknown 'sometimes'"),
        (["--set", "distribution=uniform", "--set", "max_objects=65"], "max_objects: 65 exceeds the 64"),
        (["--workers", "0"], "workers: must be ≥ 1"),
        (["--set", "test_fraction=0.9"], "test_fraction"),
    ],
)
def test_bad_configurations_exit_2_with_one_line(tmp_path, capsys, extra, needle):
    code, out, err = run(["generate", "colorshape", "--out", tmp_path / "x", "--n-train", 4, *extra], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("bench: error: ") and needle in err, err
    assert not (tmp_path / "x").exists()  # failed before any work


def test_bad_input_in_a_real_process(tmp_path):
    p = subprocess.run([*BENCH, "generate", "nosuch", "--out", str(tmp_path / "y")], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.startswith("bench: error: generator: unknown 'nosuch'; allowed: colorshape, clevr, toys")
    assert "Traceback" not in p.stderr and p.stderr.count("\n") == 1


def test_existing_dataset_needs_overwrite(balanced_small, capsys):
    code, _, err = run(["generate", "colorshape", "--out", balanced_small, "--n-train", 4], capsys)
    assert code == 2 and "--overwrite" in err


def test_info_on_non_dataset(tmp_path, capsys):
    code, _, err = run(["info", tmp_path], capsys)
    assert code == 2 and "no dataset.json" in err


def test_generators_json(capsys):
    code, out, _ = run(["generators", "--format", "json"], capsys)
    rows = json.loads(out)
    presets = {r["preset"] for r in rows if r["generator"] == "colorshape"}
    assert {"balanced", "uniform", "complexity-sweep"} <= presets


def test_generators_table_fits_100_columns_and_leaves_nothing_out(capsys):
    """`bench generators` printed 894 columns (a preset's settings and its generator's description
    on every line): at 100 columns it says every generator's description once, in its table's
    title, and every preset's settings, wrapped; `--wide` prints them unwrapped."""
    from generators.base import get_generator, list_generators

    code, out, _ = run(["generators"], capsys)
    assert code == 0 and max(map(len, out.splitlines())) <= 100 and "more column(s)" not in out, out
    flat = " ".join(out.split())
    for name in list_generators():
        g = get_generator(name)
        assert flat.count(g.description) == 1, g.description
        for preset, values in g.presets.items():
            assert preset in out and all(f"{k}=" in out for k in values), preset
    code, wide, _ = run(["generators", "--wide"], capsys)
    assert code == 0 and max(map(len, wide.splitlines())) > 100
    assert "n_train=39200, n_val=9800, n_test=9800" in wide


def test_complexity_sweep_writes_one_dataset_per_n(tmp_path, capsys):
    code, _, err = run(["generate", "colorshape", "--preset", "complexity-sweep", "--out", tmp_path / "sweep",
                        "--n-train", 8, "--n-val", 4, "--n-test", 4, "--set", "sweep=1,3,7"], capsys)
    assert code == 0, err
    for n, h in [(1, 0.0), (3, 2.584962500721156), (7, 12.299208794904189)]:  # log2 n!
        card = Dataset(tmp_path / "sweep" / f"n{n}").card
        assert card["splits"]["test"]["H_O_given_F"] == pytest.approx(h)
        assert card["config"]["n_objects"] == n


def test_preview_writes_contact_sheet(balanced_small, tmp_path, capsys):
    out = tmp_path / "sheet.png"
    code, _, err = run(["preview", balanced_small, "--out", out, "--n", 6], capsys)
    assert code == 0, err
    with Image.open(out) as im:
        assert im.size == (4 * (2 * 192 + 8), 2 * (192 + 80 + 8))  # 4 columns x 2 rows of scene | mask cells
        sheet = np.asarray(im.convert("RGB"))
    scene, mask = sheet[:192, :192], sheet[:192, 196:388]
    assert (scene == 255).all(-1).mean() > 0.5  # white canvas with some shapes
    assert (scene != 255).any()
    assert (mask == 0).all(-1).mean() > 0.5  # black background, coloured instances
    assert (mask != 0).any(-1).sum() == (scene != 255).any(-1).sum()


def test_workers_split_a_single_shard_and_write_the_same_bytes(tmp_path, capsys):
    """Each split is one shard here (1,000 rows a shard by default): the workers render pieces of
    it and this process writes it, byte for byte what one worker writes."""
    from generators.engine import _cut, pieces_per_shard

    assert pieces_per_shard(3, 2) == 2 and pieces_per_shard(1, 4) == 8 and pieces_per_shard(8, 2) == 1
    assert _cut(0, 10, 4) == [(0, 2), (2, 5), (5, 7), (7, 10)] and _cut(5, 7, 8) == [(5, 6), (6, 7)]
    args = ["generate", "colorshape", "--preset", "small", "--n-train", 40, "--n-val", 9, "--n-test", 9,
            "--image-size", 128, "--seed", 3]
    assert run([*args, "--out", tmp_path / "w1", "--workers", 1], capsys)[0] == 0
    assert run([*args, "--out", tmp_path / "w3", "--workers", 3], capsys)[0] == 0
    names = sorted(p.name for p in (tmp_path / "w1").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "w3").iterdir())
    assert [n for n in names if n.endswith(".parquet")] == ["test-00000.parquet", "train-00000.parquet",
                                                            "val-00000.parquet"]
    for name in names:
        assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w3" / name).read_bytes(), name
