"""Hostile inputs (issue 17): damaged files, unsafe outputs, huge sizes, killed parents,
stalled networks, racing cache removal. Every bad input ends in exit 2 and one line on
stderr, with no traceback and nothing outside the tool's own files changed."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.cli import main
from bench.core.dataset import CARD_NAME, Dataset
from tests.helpers import make_dataset
from tests.toy_backbones import toy_module

SMALL = ["colorshape", "--preset", "small", "--n-train", "12", "--n-val", "4", "--n-test", "4", "--workers", "1"]


def tree(root: Path) -> dict[str, str]:
    """Every file under `root` with a hash of its bytes (what "nothing changed" compares)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def refused(args, capsys, root: Path | None = None) -> str:
    """Run the CLI in-process; assert exit 2, one stderr line, no traceback, `root` unchanged."""
    before = tree(root) if root else None
    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("bench: error: ") and "Traceback" not in err, err
    if root:
        assert tree(root) == before
    return lines[0]


def failed(args, capsys) -> str:
    """Run a command that fails once under way: exit 2, its progress lines, then one error line
    and no traceback."""
    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert [x for x in lines if x.startswith("bench: error: ")] == lines[-1:] and "Traceback" not in err, err
    return lines[-1]


def ok(args, capsys) -> str:
    """Run the CLI in-process; assert exit 0; return stderr (progress, notes)."""
    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert code == 0, err
    return err


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("hostile") / "ds", n_train=12, n_val=4, n_test=4, shard_size=8)


def copy(ds: Path, tmp_path: Path, name: str = "copy") -> Path:
    return Path(shutil.copytree(ds, tmp_path / name))


# -- 1. --overwrite replaces only a dataset, and only once the new one is complete -----------


def test_overwrite_refuses_a_folder_of_notes(tmp_path, capsys):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    assert "not a BindingBench dataset" in refused(["generate", *SMALL, "--out", notes, "--overwrite"], capsys,
                                                   tmp_path)


def test_overwrite_refuses_the_working_directory(tmp_path, capsys, monkeypatch):
    (tmp_path / "thesis.tex").write_text("mine")
    monkeypatch.chdir(tmp_path)
    refused(["generate", *SMALL, "--out", ".", "--overwrite"], capsys, tmp_path)


def test_overwrite_refuses_the_dataset_it_runs_in(ds, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(copy(ds, tmp_path))
    assert "working directory" in refused(["generate", *SMALL, "--out", ".", "--overwrite"], capsys, tmp_path)


def test_overwrite_refuses_a_dataset_with_foreign_files_or_a_damaged_card(ds, tmp_path, capsys):
    d = copy(ds, tmp_path)
    (d / "notes.md").write_text("mine")
    assert "notes.md" in refused(["generate", *SMALL, "--out", d, "--overwrite"], capsys, tmp_path)
    (d / "notes.md").unlink()
    (d / CARD_NAME).write_text("[1, 2]")
    refused(["generate", *SMALL, "--out", d, "--overwrite"], capsys, tmp_path)


def test_overwrite_keeps_the_old_dataset_until_the_new_one_is_complete(ds, tmp_path, capsys, monkeypatch):
    import generators.engine as engine

    d = copy(ds, tmp_path)
    old = Dataset(d).fingerprint("train")

    def crash(*a, **k):
        raise RuntimeError("crash before the new card")

    with monkeypatch.context() as m:
        m.setattr(engine, "_card", crash)
        with pytest.raises(RuntimeError):
            main(["generate", *SMALL, "--seed", "5", "--out", str(d), "--overwrite"])
    assert Dataset(d).fingerprint("train") == old  # the crash lost nothing
    assert main(["generate", *SMALL, "--seed", "5", "--out", str(d), "--overwrite"]) == 0  # resumes the staging
    assert Dataset(d).fingerprint("train") != old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]  # no staging or old copy left behind


# -- 1b. import follows the same rule: it deletes nothing it did not write -------------------

IMPORT = ["--val-fraction", "0.2", "--test-fraction", "0.2", "--image-size", "32"]


@pytest.fixture(scope="module")
def clevr_src(tmp_path_factory) -> Path:
    from tests.test_import import write_clevr

    return write_clevr(tmp_path_factory.mktemp("clevr-src") / "CLEVR_v1.0", 12, 4)


def _import(src: Path, out: Path | str, *extra) -> list[str]:
    return ["import", "clevr", "--src", src, "--out", out, *IMPORT, *extra]


def test_import_refuses_a_folder_of_notes_and_the_working_directory(clevr_src, tmp_path, capsys, monkeypatch):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    assert "not a BindingBench dataset" in refused(_import(clevr_src, notes, "--overwrite"), capsys, tmp_path)
    monkeypatch.chdir(notes)
    refused(_import(clevr_src, ".", "--overwrite"), capsys, tmp_path)


@pytest.mark.parametrize("where", ["source", "inside", "parent"])
def test_import_refuses_a_target_that_holds_or_lies_in_its_source(clevr_src, capsys, where):
    out = {"source": clevr_src, "inside": clevr_src / "images" / "ds", "parent": clevr_src.parent}[where]
    msg = refused(_import(clevr_src, out, "--overwrite"), capsys, clevr_src.parent)
    assert "source" in msg


def test_import_overwrite_keeps_notes_and_replaces_only_a_dataset(clevr_src, tmp_path, capsys):
    out = tmp_path / "ds"
    ok(_import(clevr_src, out), capsys)
    (out / "notes.md").write_text("mine")
    assert "notes.md" in refused(_import(clevr_src, out, "--overwrite"), capsys, tmp_path)
    (out / "notes.md").unlink()
    old = tree(out)
    ok(_import(clevr_src, out, "--overwrite", "--split-seed", "3"), capsys)
    assert tree(out) != old and sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no staging left


def _leftover_staging(out: Path, extra: str | None = None) -> Path:
    """What a writer killed with -9 leaves beside `out`: a staging folder with its manifest, a
    shard, a temporary and an unheld lock (the kernel dropped the flock with the process)."""
    from bench.core.outdir import LOCK_NAME, MANIFEST_NAME, staging_path

    staging = staging_path(out)
    staging.mkdir(parents=True)
    (staging / MANIFEST_NAME).write_text(json.dumps({"key": "killed", "files": ["train-00000.parquet"]}))
    (staging / "train-00000.parquet").write_bytes(b"half")
    (staging / ".train-00000.parquet.tmp-99999").write_bytes(b"half")
    (staging / LOCK_NAME).write_bytes(b"")
    if extra:
        (staging / extra).write_text("mine")
    return staging


def test_a_killed_imports_staging_is_cleaned_by_the_next_run(clevr_src, tmp_path, capsys):
    out = tmp_path / "ds"
    staging = _leftover_staging(out)
    ok(_import(clevr_src, out), capsys)
    assert not staging.exists() and Dataset(out).num_rows("train") > 0
    staging = _leftover_staging(tmp_path / "other", extra="notes.md")  # someone's file in it: left alone
    assert "notes.md" in refused(_import(clevr_src, tmp_path / "other"), capsys)
    assert (staging / "notes.md").read_text() == "mine" and not (tmp_path / "other").exists()


def test_a_second_writer_is_refused_while_the_first_holds_the_folder(ds, clevr_src, tmp_path, capsys):
    from bench.core.outdir import LOCK_NAME

    d = tmp_path / "d"
    d.mkdir()
    fd = os.open(d / LOCK_NAME, os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a running writer
    try:
        assert "being written" in refused(["generate", *SMALL, "--out", d], capsys, tmp_path)
        assert "being written" in refused(_import(clevr_src, d), capsys, tmp_path)
    finally:
        os.close(fd)  # the writer dies: its lock goes with it, the lock file stays
    ok(["generate", *SMALL, "--out", d], capsys)
    assert sorted(p.name for p in d.iterdir() if p.name.startswith(".")) == []  # lock and manifest removed


def test_resume_renders_a_damaged_shard_again(tmp_path, capsys, monkeypatch):
    import generators.engine as engine

    d = tmp_path / "d"
    args = ["generate", *SMALL, "--set", "shard_size=4", "--out", str(d)]
    with monkeypatch.context() as m:
        m.setattr(engine, "_card", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("killed")))
        with pytest.raises(RuntimeError):
            main(args)
    shard = d / "train-00001.parquet"
    shard.write_bytes(shard.read_bytes()[:100])
    assert "train-00001.parquet is damaged; rendering it again" in ok(args, capsys)
    assert Dataset(d).fingerprint("train") == Dataset(make_dataset(tmp_path / "fresh", n_train=12, n_val=4, n_test=4,
                                                                   shard_size=4)).fingerprint("train")


def test_an_unfinished_run_of_other_settings_is_refused_not_mixed_or_deleted(tmp_path, capsys, monkeypatch):
    """A killed run with --seed 1, then the same folder with --seed 2: the second threw the first's
    shards away without a word; it now names what differs and leaves them, the first's own
    command resumes them, and --overwrite starts afresh with a card that describes every shard."""
    import generators.engine as engine

    d = tmp_path / "d"
    args = ["generate", *SMALL, "--set", "shard_size=4", "--out", str(d)]
    with monkeypatch.context() as m:
        m.setattr(engine, "_card", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("killed")))
        with pytest.raises(RuntimeError):
            main([*args, "--seed", "1"])
    capsys.readouterr()
    msg = refused([*args, "--seed", "2"], capsys, tmp_path)
    assert "unfinished dataset of other settings (seed 1, here 2)" in msg and "--overwrite" in msg, msg
    more = [*args, "--seed", "1", "--n-train", "20"]  # more shards: other settings too
    assert "n_train 12, here 20" in refused(more, capsys, tmp_path)
    ok([*args, "--seed", "2", "--overwrite"], capsys)
    fresh = make_dataset(tmp_path / "fresh", n_train=12, n_val=4, n_test=4, shard_size=4, seed=2)
    for split in ("train", "val", "test"):
        assert Dataset(d).fingerprint(split) == Dataset(fresh).fingerprint(split)


# -- 3. damaged inputs and unwritable outputs ----------------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "list", "garbled", "no-splits", "bad-split", "missing"])
def test_damaged_card(ds, tmp_path, capsys, damage):
    d = copy(ds, tmp_path)
    card = d / CARD_NAME
    text = card.read_text()
    if damage == "truncated":
        card.write_text(text[: len(text) // 2])
    elif damage == "list":
        card.write_text("[]")
    elif damage == "garbled":
        card.write_bytes(b"\xff\xfe" + os.urandom(64))
    elif damage == "missing":
        card.unlink()
    else:
        obj = json.loads(text)
        if damage == "no-splits":
            del obj["splits"]
        else:
            obj["splits"]["train"]["shards"] = "train-00000.parquet"
        card.write_text(json.dumps(obj))
    refused(["info", d], capsys, tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "garbled", "missing", "rows"])
def test_damaged_shard(ds, tmp_path, capsys, damage):
    d = copy(ds, tmp_path)
    shard = d / "train-00001.parquet"
    data = shard.read_bytes()
    if damage == "truncated":
        shard.write_bytes(data[: len(data) // 2])
    elif damage == "garbled":
        shard.write_bytes(data[:4] + bytes(b ^ 0x5A for b in data[4:-8]) + data[-8:])
    elif damage == "missing":
        shard.unlink()
    else:  # the card promises more rows than the shards hold
        obj = json.loads((d / CARD_NAME).read_text())
        obj["splits"]["train"]["n"] += 1
        (d / CARD_NAME).write_text(json.dumps(obj))
    refused(["preview", d, "--split", "train", "--n", "12", "--out", tmp_path / "sheet.png"], capsys, tmp_path)


def _damage(d: Path, kind: str) -> str:
    """Damage a dataset copy the way a hand, a script or a bad copy would; returns the name of the
    file a refusal must name."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    card = json.loads((d / CARD_NAME).read_text())
    shard = d / "train-00001.parquet"
    if kind == "swapped":
        os.replace(shard, d / "swap")
        os.replace(d / "train-00000.parquet", shard)
        os.replace(d / "swap", d / "train-00000.parquet")
        return "train-00000.parquet"
    if kind == "wide-F":  # F rows one value too wide, the content hashes untouched
        t = pq.read_table(shard)
        wide = pa.array([f + [0] for f in t["F"].to_pylist()], t.schema.field("F").type)
        pq.write_table(t.set_column(t.schema.get_field_index("F"), "F", wide), shard)
        return shard.name
    if kind == "foreign":  # someone's Parquet file at a shard's name
        from bench.core.results import RESULT_SCHEMA

        pq.write_table(RESULT_SCHEMA.empty_table(), shard)
        return shard.name
    if kind == "generator":
        card["generator"] = {}
    elif kind == "fingerprint":  # the card no longer describes its shards
        card["splits"]["train"]["fingerprint"] = "0" * 64
    (d / CARD_NAME).write_text(json.dumps(card))
    return CARD_NAME


READERS = {
    "info": lambda d, tmp: ["info", d],
    "preview": lambda d, tmp: ["preview", d, "--split", "train", "--out", tmp / "sheet.png"],
    "evaluate": lambda d, tmp: ["evaluate", "--model", "pixels:8", "--dataset", d, "--results", tmp / "results"],
    "extract": lambda d, tmp: ["extract", "--model", "pixels:8", "--dataset", d, "--cache-dir", tmp / "cache"],
}


@pytest.mark.parametrize("command", list(READERS))
@pytest.mark.parametrize("kind", ["swapped", "wide-F", "foreign", "generator", "fingerprint"])
def test_every_reader_names_the_damaged_file(ds, tmp_path, capsys, kind, command):
    d = copy(ds, tmp_path)
    name = _damage(d, kind)
    msg = refused(READERS[command](d, tmp_path), capsys, tmp_path)
    assert name in msg and "damaged" in msg


@pytest.mark.parametrize("damage", ["truncated", "swapped", "card"])
def test_site_warns_on_a_damaged_dataset(ds, tmp_path, capsys, damage):
    """`bench site --datasets` given a dataset `bench info` refuses: one warning line saying what
    `bench info` says, the dataset's page says it is damaged (no preview sheet or settings shown as
    if fine), a sound dataset beside it keeps its page, and the rest of the site builds. A card too
    damaged to read cannot be matched to the results: the warning says it is left out."""
    from html import escape

    from bench.core.results import write_run
    from test_leaderboard import result_row

    bad = copy(ds, tmp_path / "data", "bad")
    good = make_dataset(tmp_path / "data" / "good", n_train=4, n_val=4, n_test=4, seed=1)
    write_run([result_row("A", "linear", 0.3, dataset=d.name, fingerprint=Dataset(d).fingerprint("test"))
               for d in (good, bad)], tmp_path / "results", "r1")
    if damage == "truncated":
        shard = bad / "train-00001.parquet"
        shard.write_bytes(shard.read_bytes()[:200])
    elif damage == "swapped":
        _damage(bad, "swapped")
    else:
        (bad / CARD_NAME).write_text("{")
    info = refused(["info", bad], capsys).removeprefix("bench: error: ")
    err = ok(["site", tmp_path / "results", "-o", tmp_path / "site", "--datasets", tmp_path / "data"], capsys)
    (warning,) = [line for line in err.splitlines() if "warning" in line]
    assert warning.startswith(f"bench: warning: {info}"), (warning, info)
    site = tmp_path / "site"
    assert "preview sheet of good" in (site / "dataset-good.html").read_text()
    assert (site / "index.html").is_file() and (site / "backbone-A.html").is_file()
    page = (site / "dataset-bad.html").read_text()
    assert "<img" not in page and "Generator settings" not in page
    if damage == "card":
        assert warning.endswith("left out of the site") and "Not given" in page
    else:
        assert f"Damaged: {escape(info, quote=False)}" in page and not list(site.glob("fig-dataset-bad*"))

def test_unwritable_outputs_fail_before_work(ds, tmp_path, capsys):
    (tmp_path / "file").write_text("not a directory")
    refused(["generate", *SMALL, "--out", tmp_path / "file" / "sub"], capsys, tmp_path)
    refused(["generate", *SMALL, "--out", tmp_path / "file"], capsys, tmp_path)
    refused(["preview", ds, "--out", tmp_path / "file" / "sheet.png"], capsys, tmp_path)
    refused(["preview", ds, "--out", tmp_path], capsys, tmp_path)  # a directory
    refused(["preview", ds, "--out", tmp_path / "sheet.foo"], capsys, tmp_path)  # a format it cannot write


def test_damaged_results_file(tmp_path, capsys):
    from bench.core.results import RESULT_SCHEMA, write_parquet_atomic

    results = tmp_path / "results"
    results.mkdir()
    write_parquet_atomic(RESULT_SCHEMA.empty_table(), results / "run.parquet")
    data = (results / "run.parquet").read_bytes()
    (results / "run.parquet").write_bytes(data[:-10])
    assert "run.parquet" in refused(["leaderboard", results], capsys, tmp_path)


@pytest.mark.parametrize("command", [["leaderboard"], ["plot", "layers"], ["report"]])
def test_results_file_with_null_key_cells(tmp_path, capsys, command):
    from bench.core.results import make_table, write_parquet_atomic

    results = tmp_path / "results"
    results.mkdir()
    row = {"backbone": None, "dataset": "d", "task": "binding", "split": "test", "layer": 1, "seed": 0,
           "status": "ok", "probe": "linear"}
    write_parquet_atomic(make_table([row]), results / "run.parquet")
    msg = refused([*command, results, *(["--out", tmp_path / "o"] if command != ["leaderboard"] else [])],
                  capsys, results)
    assert "run.parquet" in msg and "backbone" in msg


def _damage_cache_entry(entry: Path, kind: str) -> None:
    arr = sorted(entry.glob("*.npy"))[0]
    data = arr.read_bytes()
    if kind == "empty":
        arr.write_bytes(b"")
    elif kind == "truncated":
        arr.write_bytes(data[:-7])
    elif kind == "bad-header":
        arr.write_bytes(b"NOTNUMPY" + data[8:])
    else:
        (entry / "entry.json").write_text("[1, 2]")


@pytest.mark.parametrize("kind", ["empty", "truncated", "bad-header", "list-entry"])
def test_damaged_cache_entry_is_set_aside_and_recomputed(ds, tmp_path, capsys, monkeypatch, kind):
    import pyarrow.parquet as pq

    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    run = ["evaluate", "--model", "pixels:8", "--dataset", ds, "--threads", "1"]
    ok([*run, "--results", tmp_path / "r1"], capsys)
    entries = sorted((tmp_path / "cache" / "activations").glob("*/*"))
    _damage_cache_entry(entries[0], kind)
    assert main(["cache", "ls"]) == 0
    assert "damaged" in capsys.readouterr().out
    err = ok([*run, "--results", tmp_path / "r2"], capsys)
    assert "Traceback" not in err

    def metric(d: Path) -> list:
        return pq.read_table(next(d.glob("*.parquet")))["B_star"].to_pylist()

    assert metric(tmp_path / "r1") == metric(tmp_path / "r2")
    assert sum(e.name.startswith("damaged-") for e in entries[0].parent.iterdir()) == (kind != "list-entry")


def _binding_numbers(results: Path) -> list:
    import pyarrow.parquet as pq

    table = pq.read_table(next(results.glob("*.parquet")))
    columns = ("backbone", "probe", "B_star", "beta_star", "L_O_paper", "L_F_paper", "bit_accuracy")
    return list(zip(*(table[c].to_pylist() for c in columns)))


def test_a_zeroed_cache_array_is_found_set_aside_and_recomputed(ds, tmp_path, capsys, monkeypatch):
    """Right size, right header, every value 0: it passed the header and size checks and was read
    back as activations, changing the numbers. The digest written with the entry finds it."""
    from evaluators.cache import entries as cache

    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    run = ["evaluate", "--model", "pixels:8", "--dataset", ds, "--probes", "linear", "--threads", "1"]
    ok([*run, "--results", tmp_path / "r1"], capsys)
    (test_entry,) = [e for e in (tmp_path / "cache" / "activations").glob("*/*")
                     if cache.read_meta(e)["material"]["split"] == "test"]
    for arr in test_entry.glob("*.npy"):
        offset = cache._data_offset(arr)
        size = arr.stat().st_size
        with open(arr, "r+b") as f:
            f.seek(offset)
            f.write(bytes(size - offset))
    err = ok([*run, "--results", tmp_path / "r2"], capsys)
    assert f"cache entry {test_entry} is damaged; set aside" in err, err
    assert _binding_numbers(tmp_path / "r2") == _binding_numbers(tmp_path / "r1")


def test_cache_entries_are_hashed_once(ds, tmp_path, capsys, monkeypatch):
    """The digest is checked once per entry, not on every read: a run reads each entry twice or
    more (its size estimate, then its extraction), and a later run not at all."""
    from bench.core.hashing import file_sha256
    from evaluators.cache import entries as cache

    hashed = []
    monkeypatch.setattr(cache, "file_sha256", lambda path: hashed.append(Path(path).name) or file_sha256(path))
    monkeypatch.setattr(cache, "RACY_S", 0.0)  # nothing changes the files here: remember at once
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    run = ["evaluate", "--model", "pixels:8", "--dataset", ds, "--probes", "linear", "--threads", "1", "--results"]
    ok([*run, tmp_path / "r1"], capsys)
    assert len(hashed) == 3  # one array a split, hashed when written
    for results, expect in (("r2", 6), ("r3", 6)):
        cache._VERIFIED.clear()  # a new process
        ok([*run, tmp_path / results], capsys)
        assert len(hashed) == expect, hashed


@pytest.mark.parametrize("args", [["--set", "seed=3", "--seed", "4"], ["--set", "image_size=64", "--image-size", "128"]])
def test_a_set_value_a_flag_shadows_is_refused(tmp_path, capsys, args):
    msg = refused(["generate", *SMALL, *args, "--out", tmp_path / "d"], capsys, tmp_path)
    assert "--set" in msg and args[3] in msg


def test_import_has_no_set_so_no_flag_can_shadow_one(clevr_src, tmp_path, capsys):
    """Every setting of `bench import` is a flag of its own: a `--set` beside one is refused in one
    line (the option parser's), never ignored."""
    msg = refused(_import(clevr_src, tmp_path / "d", "--set", "image_size=64"), capsys, tmp_path)
    assert "No such option: --set" in msg, msg


@pytest.mark.parametrize("args", [["--n-train", "-1"], ["--image-size", "0"], ["--epochs", "0"]])
def test_demo_refuses_bad_sizes_before_start_up(tmp_path, capsys, monkeypatch, args):
    import evaluators.zoo.recipes as recipes

    monkeypatch.delattr(recipes, "SCENES")  # any start-up work past validation would fail differently
    msg = refused(["demo", *args, "--out", tmp_path / "demo"], capsys, tmp_path)
    assert args[0].lstrip("-").replace("-", "_") in msg


# -- property: any truncation of a card, a shard or a results file is refused cleanly ------

_FUZZ = settings(max_examples=12, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


def _truncation_refused_or_harmless(args, capsys) -> None:
    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert code in (0, 2) and "Traceback" not in err, err
    assert code == 0 or len(err.strip().splitlines()) == 1, err


@_FUZZ
@given(frac=st.floats(0, 1, exclude_max=True))
def test_truncated_card(ds, tmp_path_factory, capsys, frac):
    d = copy(ds, tmp_path_factory.mktemp("fuzz"))
    data = (d / CARD_NAME).read_bytes()
    (d / CARD_NAME).write_bytes(data[: int(frac * len(data))])
    _truncation_refused_or_harmless(["info", d], capsys)


@_FUZZ
@given(frac=st.floats(0, 1, exclude_max=True))
def test_truncated_shard(ds, tmp_path_factory, capsys, frac):
    d = copy(ds, tmp_path_factory.mktemp("fuzz"))
    shard = d / "test-00000.parquet"
    data = shard.read_bytes()
    shard.write_bytes(data[: int(frac * len(data))])
    _truncation_refused_or_harmless(["preview", d, "--n", "4", "--out", d.parent / "sheet.png"], capsys)


@_FUZZ
@given(frac=st.floats(0, 1, exclude_max=True))
def test_truncated_results(tmp_path_factory, capsys, frac):
    from bench.core.results import RESULT_SCHEMA, write_parquet_atomic

    results = tmp_path_factory.mktemp("fuzz") / "results"
    results.mkdir()
    write_parquet_atomic(RESULT_SCHEMA.empty_table(), results / "run.parquet")
    data = (results / "run.parquet").read_bytes()
    (results / "run.parquet").write_bytes(data[: int(frac * len(data))])
    _truncation_refused_or_harmless(["leaderboard", results], capsys)


# -- 4. sizes are checked before anything is allocated or written --------------------------


def work_started(monkeypatch) -> list[str]:
    """The rendering or import work a command started (each entry point, as it is entered): a size
    refused "at once" starts none, so nothing is allocated for it."""
    from generators import engine
    from generators.importers import common

    started: list[str] = []
    for module, name in ((engine, "_write_shard"), (engine, "_render_in_pool"), (common, "write_import")):
        monkeypatch.setattr(module, name, lambda *a, _name=name, _f=getattr(module, name), **k:
                            started.append(_name) or _f(*a, **k))
    return started


@pytest.mark.parametrize("n", ["99999999999999999999", str(10**12)])
def test_absurd_size_is_refused_at_once(tmp_path, capsys, monkeypatch, n):
    started = work_started(monkeypatch)
    msg = refused(["generate", "colorshape", "--preset", "small", "--n-train", n,
                   "--out", tmp_path / "big"], capsys, tmp_path)
    assert "GiB" in msg and "room for at most" in msg and started == []


@pytest.fixture
def memory_8gib(monkeypatch):
    """8 GiB of available memory, whatever the machine has: the limits below are then exact."""
    from bench.core import resources
    from generators import engine

    for module in (resources, engine):
        monkeypatch.setattr(module, "available_memory", lambda: 8 * 2**30)


def test_an_image_side_beyond_memory_is_refused_naming_the_limit(clevr_src, tmp_path, capsys, monkeypatch,
                                                                 memory_8gib):
    """`--image-size 100000` allocated until numpy's MemoryError (or the machine swapped); 8 GiB
    at 4 bytes a pixel (RGB and mask) hold at most a 46,340-px side: refused before any scene is
    rendered or imported."""
    started = work_started(monkeypatch)
    msg = refused(["generate", *SMALL, "--image-size", "100000", "--out", tmp_path / "d"], capsys, tmp_path)
    assert msg.startswith("bench: error: image_size:") and "at most image_size 46,340 fits" in msg, msg
    msg = refused(_import(clevr_src, tmp_path / "imp", "--image-size", "100000"), capsys, tmp_path)
    assert "image-size" in msg and "at most --image-size 46,340 fits" in msg, msg
    assert started == []


def test_absurd_object_counts_are_refused(tmp_path, capsys):
    for args in (["--set", "n_objects=100000000"], ["--preset", "uniform", "--set", "max_objects=100000000"]):
        msg = refused(["generate", *SMALL, *args, "--out", tmp_path / "d"], capsys, tmp_path)
        assert "objects: 100000000" in msg, msg


def test_every_preset_passes_the_size_check(tmp_path):
    """The check refuses what cannot work, never a preset (the paper's 58,800 scenes included),
    with every core rendering: checked without generating them."""
    from generators.base import build_config, get_generator, list_generators
    from generators.engine import check_resources

    checked = 0
    for name in list_generators():
        gen = get_generator(name)
        for preset in gen.presets:
            for sub, cfg in gen.expand(build_config(gen, preset, {})):
                check_resources(gen, cfg, tmp_path / name / sub, os.cpu_count() or 1)
                checked += 1
    assert checked >= 10


# -- 5. workers die with their parent, whatever the signal --------------------------------


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_workers_die_with_their_parent(tmp_path, sig):
    d = tmp_path / "d"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from bench.cli import main; main()", "generate", "colorshape", "--preset", "small",
         "--n-train", "4000", "--n-val", "10", "--n-test", "10", "--set", "shard_size=40", "--workers", "2",
         "--out", str(d)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 300  # a hang guard: the first shard takes seconds
        while time.time() < deadline and not list(d.glob("train-*.parquet")):
            time.sleep(0.05)
        workers = _children(proc.pid)
        assert len(workers) >= 2 and list(d.glob("train-*.parquet"))
        os.kill(proc.pid, sig)  # the parent alone, as `kill` would
        proc.wait()
        deadline = time.time() + 10
        while time.time() < deadline and any(_alive(w) for w in workers):
            time.sleep(0.05)
        assert not [w for w in workers if _alive(w)]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


# -- 6. a stalled hub fails within its deadline, through the configured proxy ---------------


class StalledServer:
    """Accepts connections on 127.0.0.1 and never answers (HEAD gets a 200 when asked to)."""

    def __init__(self, answer_head: bool = False) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests: list[bytes] = []
        self.conns: list[socket.socket] = []
        self.answer_head = answer_head
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(4096)
            self.requests.append(data)
            if self.answer_head and data.startswith(b"HEAD"):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                conn.close()
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def hub(tmp_path, monkeypatch):
    import evaluators.backbones.hub as hub_module

    monkeypatch.setattr(hub_module, "PROBE_DEADLINE_S", 1.0)
    monkeypatch.setattr(hub_module, "STALL_DEADLINE_S", 1.0)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    servers = []

    def start(answer_head: bool = False) -> StalledServer:
        servers.append(StalledServer(answer_head))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def _refusal(capsys, args) -> str:
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_stalled_hub_fails_within_the_deadline(hub, capsys, monkeypatch):
    """The probe waits out its deadline (the hub's 1 s) and no more: the command fails then. (That
    the watchdog gives up at its deadline is test_the_network_watchdog_gives_up_...'s, on a fake clock.)"""
    from tests.test_backbones import network_waits

    server = hub()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.port}")
    waits = network_waits(monkeypatch)
    err = _refusal(capsys, ["models", "someone/some-model"])
    assert "unreachable" in err and server.requests and waits == [(1.0, "timed out")]


def test_stall_after_the_probe_fails_within_the_deadline(hub, capsys, monkeypatch):
    from tests.test_backbones import network_waits

    server = hub(answer_head=True)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.port}")
    waits = network_waits(monkeypatch)
    err = _refusal(capsys, ["models", "someone/some-model"])
    assert "sent nothing for 1 s" in err and waits == [(1.0, "returned"), (1.0, "timed out")]


def test_probe_goes_through_the_proxy_and_honours_no_proxy(hub, capsys, monkeypatch):
    proxy = hub()
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.invalid")
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
    _refusal(capsys, ["models", "someone/some-model"])
    assert any(b"hub.invalid" in r for r in proxy.requests)  # asked the proxy, not DNS
    direct = hub()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{direct.port}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    n = len(proxy.requests)
    _refusal(capsys, ["models", "someone/some-model"])
    assert direct.requests and len(proxy.requests) == n


# -- 7. `cache rm` respects the lock of an entry being written --------------------------------


def test_cache_rm_refuses_a_locked_entry(tmp_path, capsys):
    entry = tmp_path / "cache" / "activations" / "base0000" / "sel0"
    entry.mkdir(parents=True)
    (entry / "state.json").write_text(json.dumps({"n_done": 1, "n": 4, "material": {}}))
    fd = os.open(entry / ".lock", os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a running extraction
    try:
        assert "being written" in refused(["cache", "rm", "--all", "--cache-dir", tmp_path / "cache"], capsys,
                                          tmp_path)
    finally:
        os.close(fd)
    assert main(["cache", "rm", "--all", "--cache-dir", str(tmp_path / "cache")]) == 0
    assert not entry.exists()


# -- 7b. a full disk ends in one line and leaves the last good file in place -----------------


def _fills_disk(write, *, on_call: int = 1, target=lambda args: args[1]):
    """`write` that meets a full disk on its call number `on_call`: half a file reaches
    `target(args)`, then ENOSPC, as a real full disk does."""
    calls = []

    def full(*args, **kwargs):
        calls.append(args)
        if len(calls) < on_call:
            return write(*args, **kwargs)
        Path(target(args)).write_bytes(b"PAR1 half a file")
        raise OSError(errno.ENOSPC, "No space left on device")

    return full


def test_a_full_disk_while_evaluate_writes_results_keeps_the_last_good_file(ds, tmp_path, capsys, monkeypatch):
    """The run's file is rewritten after each backbone: when the second write meets a full disk,
    the run ends with exit 2 and one line, and the file still holds the first backbone's rows."""
    import pyarrow.parquet as pq

    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(pq, "write_table", _fills_disk(pq.write_table, on_call=2))
    results = tmp_path / "results"
    msg = failed(["evaluate", "--model", "pixels:8", "--model", "oracle:objects", "--dataset", ds, "--probes", "linear",
                   "--threads", "1", "--results", results], capsys)
    assert "No space left on device" in msg and "free space" in msg, msg
    monkeypatch.undo()
    (kept,) = results.iterdir()  # no temporary left beside it
    assert set(pq.read_table(kept)["backbone"].to_pylist()) == {"pixels:8"}


def test_a_full_disk_while_extracting_is_not_an_error_row(ds, tmp_path, capsys, monkeypatch):
    """A full activations cache ended with exit 0 and error rows standing as the backbone's result."""
    from evaluators.cache import entries as cache

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "_pwrite_all", full)
    msg = failed(["evaluate", "--model", "pixels:8", "--dataset", ds, "--probes", "linear", "--threads", "1",
                   "--results", tmp_path / "results"], capsys)
    assert "disk full while extracting pixels:8" in msg, msg
    assert not any((tmp_path / "results").glob("*.parquet"))


@pytest.mark.parametrize("command", [["leaderboard", "--format", "markdown", "--out", "OUT/board.md"],
                                     ["report", "-o", "OUT/board.md"]])
def test_a_full_disk_keeps_the_old_leaderboard_or_report(ds, tmp_path, capsys, monkeypatch, command):
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    ok(["evaluate", "--model", "oracle:objects", "--dataset", ds, "--probes", "linear", "--threads", "1",
        "--results", tmp_path / "results"], capsys)
    out = tmp_path / "out"
    args = [*command[:1], tmp_path / "results", *[a.replace("OUT", str(out)) for a in command[1:]]]
    ok(args, capsys)
    good = (out / "board.md").read_bytes()
    monkeypatch.setattr(Path, "write_text", _fills_disk(Path.write_text, target=lambda args: args[0]))
    msg = failed(args, capsys)
    assert "board.md: No space left on device (free space and run again)" in msg, msg
    assert (out / "board.md").read_bytes() == good and not list(out.glob(".*.tmp-*"))


def test_a_full_disk_while_the_zoo_publishes_a_model(tmp_path, capsys, monkeypatch):
    """safetensors reports a full disk as its own error type (a traceback before); no half model
    is left, under its name or a temporary one, and the next run trains it."""
    import transformers.modeling_utils as mu

    from tests.test_zoo import use_tiny_zoo

    zoo = use_tiny_zoo(tmp_path, monkeypatch)

    def full(*args, **kwargs):
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

    with monkeypatch.context() as m:
        m.setattr(mu, "safe_save_file", full)
        msg = failed(["zoo", "train", "untrained"], capsys)
    assert "zoo: disk full while writing" in msg, msg
    assert not [p for p in zoo.iterdir() if not p.name.endswith(".partial") and p.name != "data"]
    ok(["zoo", "train", "untrained"], capsys)


def test_a_full_disk_while_the_zoo_checkpoints(tmp_path, capsys, monkeypatch):
    """torch.save into a full disk raised a RuntimeError naming no cause; the checkpoint is now
    written as bytes, so the error is the disk's, in one line, and no half checkpoint stays."""
    from tests.test_zoo import use_tiny_zoo

    zoo = use_tiny_zoo(tmp_path, monkeypatch)
    monkeypatch.setattr(Path, "write_bytes", _checkpoint_full())
    msg = failed(["zoo", "train", "features"], capsys)
    assert "state.pt: No space left on device (free space and run again)" in msg, msg
    (partial,) = zoo.glob(".features-*.partial")
    assert sorted(p.name for p in partial.iterdir()) == ["run.json"]


def _checkpoint_full():
    """Path.write_bytes that fills the disk when a zoo checkpoint is written."""
    write = Path.write_bytes

    def full(self, data):
        if ".state.pt.tmp-" not in self.name:
            return write(self, data)
        write(self, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    return full


# -- 8. the smaller points -----------------------------------------------------------------


def test_small_validations(ds, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    refused(["cache", "ls", "--cache-dir", tmp_path / "file"], capsys, tmp_path)
    refused(["extract", "--model", "pixels:8", "--dataset", ds, "--split", "test", "--image-size", "0",
             "--cache-dir", tmp_path / "cache"], capsys, tmp_path)
    refused(["extract", "--model", "pixels:8", "--dataset", ds, "--split", "test", "--cache-dir", tmp_path / "file" / "c"],
            capsys, tmp_path)
    refused(["demo", "--out", tmp_path / "file" / "demo"], capsys, tmp_path)  # before any training
    refused(["toys-analysis", "--model", "pixels:8", "--dataset", ds, "--heatmap-scenes", "-1"], capsys, tmp_path)


def test_binding_refuses_a_dataset_without_object_entropy(tmp_path, capsys):
    flat = make_dataset(tmp_path / "flat", n_colors=3, n_shapes=1, n_objects=1, colors_per_scene=1, shapes_per_scene=1,
                        val_fraction=0.34, test_fraction=0.33, n_train=8, n_val=4, n_test=4)
    assert Dataset(flat).card["splits"]["test"]["H_O"] == 0
    err = refused(["evaluate", "--model", "pixels:8", "--dataset", flat, "--results", tmp_path / "results"], capsys)
    assert "H(O) = 0" in err and "generate a dataset whose scenes vary" in err  # imported data: see test_import


# -- 2. 3D bytes are the same in every process ------------------------------------------------

_RENDER = """
import hashlib, sys
from generators.base import build_config, get_generator
from generators.engine import scene_seed
junk = [object() for _ in range(int(sys.argv[1]))]  # shifts every later object's address
gen_cls = get_generator("clevr")
gen = gen_cls(build_config(gen_cls, "small", {"seed": 4, "image_size": 96}))
for i in range(4):
    scene, _ = gen.render("train", i, scene_seed(4, "train", i))
    print(hashlib.sha256(scene.image.tobytes() + scene.mask.tobytes()).hexdigest())
"""


def _needs_pyrender() -> None:
    """Skip without pyrender, without importing it: imported before `pyrender_setup.load_pyrender`
    chooses the OpenGL platform, it binds PyOpenGL to GLX for the whole process, and every later
    render fails."""
    if importlib.util.find_spec("pyrender") is None:
        pytest.skip("pyrender is not installed")


def test_3d_lights_are_summed_in_insertion_order():
    _needs_pyrender()
    from generators import pyrender_setup

    pr = pyrender_setup.load_pyrender()
    for junk in range(8):  # other address layouts give other set orders
        _ = [object() for _ in range(junk * 37)]
        scene = pyrender_setup.ordered_scene()()
        lights = [pr.PointLight(intensity=1.0 + i) if i % 2 else pr.DirectionalLight(intensity=1.0 + i)
                  for i in range(6)]
        nodes = [scene.add(light) for light in lights]
        assert list(scene.light_nodes) == nodes


def test_3d_render_is_byte_identical_across_processes():
    _needs_pyrender()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    outs = [subprocess.run([sys.executable, "-c", _RENDER, str(junk)], capture_output=True, text=True, env=env,
                           check=True).stdout for junk in (0, 12345)]
    assert len(outs[0].split()) == 4 and outs[0] == outs[1]


def test_empty_and_absurd_arguments_are_refused_before_any_work(ds, tmp_path, capsys, monkeypatch):
    """An empty string selects everything where prefixes or defaults are matched (every cache key
    starts with "", `--preset ""` fell back to the default paper-size preset): refuse instead."""
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    assert "cache key: empty" in refused(["cache", "rm", ""], capsys)
    assert "preset" in refused(["generate", "colorshape", "--preset", "", "--out", tmp_path / "d"], capsys, tmp_path)
    assert "model: empty spec" in refused(["models", ""], capsys)
    for args, message in ((["--probes", ""], "probes: empty"), (["--seeds", "-1"], "seeds: 1 to 1000"),
                          (["--seeds", ",".join(map(str, range(1001)))], "seeds: 1 to 1000"),
                          (["--threads", "1000000"], "threads: at most"), (["--dtype", "fp8"], "dtype: unknown")):
        assert message in refused(["evaluate", "--model", "pixels", "--dataset", ds, "--results", tmp_path / "r",
                                   *args], capsys, tmp_path)
    assert "metric: unknown 'nosuch'" in refused(["report", "--metric", "nosuch", "-o", tmp_path / "r.html"],
                                                 capsys, tmp_path)


def test_a_ray_address_nothing_answers_at_fails_fast(tmp_path, capsys, monkeypatch):
    """`ray.init` waited minutes for a head that is not there: the refused connection is said, and
    Ray is never started."""
    ray = pytest.importorskip("ray")
    inits: list[tuple] = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: inits.append(a))
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    line = refused(["generate", "colorshape", "--preset", "small", "--n-train", "4", "--n-val", "2", "--n-test", "2",
                    "--out", tmp_path / "d", "--executor", "ray",
                    "--address", f"127.0.0.1:{port}"], capsys, tmp_path)
    assert f"address: nothing answers at 127.0.0.1:{port} (Connection refused)" in line and inits == []


# -- 9. a layer holding NaN or inf fails alone (issue 56) -----------------------------------

_BAD_LAYER = toy_module("[Block(0.0), Block(float('BAD'))]", preamble="""
class Block(torch.nn.Module):
    def __init__(self, bad):
        super().__init__()
        self.lin, self.bad = torch.nn.Linear(24, 24), bad

    def forward(self, t):
        return self.lin(t) + self.bad
""")

#: The columns of a row that are its measurement (not its run, time or provenance).
_MEASURED = {"binding": ("probe", "tokens", "status", "error", "B_star", "beta_star", "L_F", "L_O_given_F", "checks"),
             "issameobject": ("probe", "status", "error", "accuracy", "balanced_accuracy", "auroc", "val_accuracy",
                              "best_epoch"),
             "segmentation": ("probe", "status", "error", "semantic_miou", "instance_miou", "instance_ari",
                              "best_epoch")}


def _rows_by_layer(results: Path, task: str) -> dict[int, list[tuple]]:
    import pyarrow.parquet as pq

    out: dict[int, list[tuple]] = {}
    for r in sorted(pq.read_table(next(results.glob("*.parquet"))).to_pylist(), key=lambda r: (r["layer"], r["probe"])):
        out.setdefault(r["layer"], []).append(tuple(r[c] for c in _MEASURED[task]))
    return out


@pytest.mark.parametrize("bad", ["nan", "inf"])
@pytest.mark.parametrize("task,probes", [("binding", "linear"), ("issameobject", "cosine,majority,linear"),
                                         ("segmentation", "semantic,instance")])
def test_a_layer_holding_nan_or_inf_is_its_own_error_rows(ds, tmp_path, capsys, monkeypatch, bad, task, probes):
    """Layer 2 of the backbone adds NaN (or inf) to every value, layer 1 is clean. IsSameObject made
    every row of the backbone, layer 1's too, an error row saying `Optimization bounds must be finite
    scalars` (the baselines' bias fit), never naming NaN or inf."""
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "bad.py").write_text(_BAD_LAYER.replace("BAD", bad))
    run = ["evaluate", "--task", task, "--model", f"py:{tmp_path / 'bad.py'}:make", "--dataset", ds, "--probes", probes,
           "--threads", "1", "--format", "json"]
    ok([*run, "--layers", "1,2", "--results", tmp_path / "both"], capsys)
    ok([*run, "--layers", "1", "--results", tmp_path / "clean"], capsys)
    both, clean = _rows_by_layer(tmp_path / "both", task), _rows_by_layer(tmp_path / "clean", task)
    status = _MEASURED[task].index("status")
    assert all(r[status] == "ok" for r in clean[1]) and both[1] == clean[1]  # the clean layer: the same numbers
    reading = [r for r in both[2] if r[0] != "majority"]  # majority reads no activations: its row stands
    assert reading and all(r[status] == "error" and "NaN or inf" in r[status + 1] for r in reading), both[2]
    assert all(r[status] == "ok" for r in both[2] if r[0] == "majority")


# -- 10. hostile labels and output paths (issue 56) -------------------------------------------

#: Labels no user may choose: TeX for matplotlib, too long for a file name, path separators,
#: control characters, a newline, empty, a hidden or parent folder's name.
HOSTILE_LABELS = ["a$^$b", "L" * 65, "L" * 250, "a/b", "a\\b", "a\nb", "a\x07b", "", "..", ".hidden", "a "]


@pytest.mark.parametrize("label", [x for x in HOSTILE_LABELS if not any(c in x for c in "/\\")],
                         ids=lambda x: repr(x[:12]))
def test_a_hostile_backbone_name_is_refused_by_evaluate(ds, tmp_path, capsys, label):
    """`evaluate -m 'a$^$b=pixels'` was accepted, and its rows then broke `report`, `plot` and `site`.
    (A NAME with / or \\ makes the whole argument a spec, a path: see the api test below.)"""
    line = refused(["evaluate", "-m", f"{label}=pixels", "--dataset", ds, "--results", tmp_path / "r"], capsys,
                   tmp_path)
    assert "model: the NAME of NAME=SPEC" in line and "1 to 64 characters: letters, digits, space" in line, line


def test_a_name_inside_the_rule_is_accepted():
    from evaluators.runner.request import named_spec

    assert named_spec("DINOv2 small (v1.2)+reg_4-x=pixels").name == "DINOv2 small (v1.2)+reg_4-x"
    assert named_spec("L" * 64 + "=pixels").name == "L" * 64
    assert named_spec("./runs/lr=0.1").spec == "./runs/lr=0.1"  # a path holding `=` stays a spec


@pytest.mark.parametrize("label", HOSTILE_LABELS, ids=lambda x: repr(x[:12]))
def test_a_hostile_display_name_is_refused_by_the_api(tmp_path, label):
    from evaluators.runner.request import EvaluationRequest
    from bench.core.errors import BenchError

    with pytest.raises(BenchError) as e:
        EvaluationRequest({label: "pixels"}, tmp_path)
    assert "model: a display name" in str(e.value) and "\n" not in str(e.value)


def _study(name: str = "s", dataset: str = "d", backbone: str = "b") -> str:
    """A study's text with the three labels it names (TOML basic strings: JSON's escapes)."""
    return (f"name = {json.dumps(name)}\n[datasets.{json.dumps(dataset)}]\ngenerator = 'colorshape'\n"
            f"[[evaluate]]\nbackbones = {{ {json.dumps(backbone)} = 'pixels' }}\n")


@pytest.mark.parametrize("label", HOSTILE_LABELS, ids=lambda x: repr(x[:12]))
@pytest.mark.parametrize("where, key", [("name", "name: the study's name"),
                                        ("dataset", "datasets: a dataset name"),
                                        ("backbone", "evaluate[1].backbones.")])
def test_a_hostile_study_label_is_refused_naming_the_rule(tmp_path, capsys, monkeypatch, label, where, key):
    monkeypatch.chdir(tmp_path)
    study = tmp_path / "study.toml"
    study.write_text(_study(**{where: label}))
    line = refused(["run", study, "--out", tmp_path / "out", "--dry-run"], capsys, tmp_path)
    assert f"{study}: {key}" in line and "1 to 64 characters: letters, digits, space" in line, line
    study.write_text(_study(**{where: "Ok name (v2)+x_1.0-b"}))  # the same study under a label inside the rule
    ok(["run", study, "--out", tmp_path / "out", "--dry-run"], capsys)


@pytest.fixture(scope="module")
def hostile_results(tmp_path_factory) -> Path:
    """A results folder written before labels were checked: backbones and a dataset named with
    TeX, a 250-character name, path separators and a newline, two layers each."""
    import numpy as np

    from bench.core.results import write_run
    from test_leaderboard import per_scene_rows

    rng = np.random.default_rng(0)
    base = rng.uniform(2.0, 9.0, 60)
    rows = []
    for name in ["a$^$b", "L" * 250, "a/b\\c", "x\ny", "ok"]:
        for layer in (1, 2):
            row = per_scene_rows(name, base + rng.normal(0, 0.05, 60), layer=layer, n_layers=2, val_bits=5.0)
            row.update(dataset="cs $x$", dataset_fingerprint="f" * 64)
            rows.append(row)
    results = tmp_path_factory.mktemp("hostile-labels") / "results"
    write_run(rows, results, "r1")
    return results


def test_old_results_with_hostile_labels_still_render(hostile_results, tmp_path, capsys):
    """`report` and `plot` ended in matplotlib's ParseSyntaxException on a `$`; `site` in `File
    name too long` on the 250-character name, with some pages left behind."""
    ok(["report", hostile_results, "-o", tmp_path / "report.html"], capsys)
    for kind in ("bars", "layers"):
        ok(["plot", kind, hostile_results, "-o", tmp_path / kind], capsys)
        assert (tmp_path / f"{kind}.png").stat().st_size > 0 and (tmp_path / f"{kind}.svg").stat().st_size > 0
    pages = []
    for build in ("site", "again"):
        ok(["site", hostile_results, "-o", tmp_path / build], capsys)
        pages.append(sorted(p.name for p in (tmp_path / build).iterdir()))
    backbone_pages = [p for p in pages[0] if p.startswith("backbone-")]
    assert len(backbone_pages) == 5 and pages[0] == pages[1]  # every backbone its page, named alike each build
    assert max(map(len, pages[0])) <= 120, max(pages[0], key=len)
    long_page = next(p for p in backbone_pages if p.startswith("backbone-LLLL"))
    assert "L" * 250 in html_text(tmp_path / "site" / long_page)


def test_an_ablation_plot_of_results_without_intervened_backbones_is_refused(tmp_path, capsys):
    """`bench plot ablation` of results that hold no intervened backbone: one line, exit 2, no file."""
    from bench.core.results import write_run
    from test_leaderboard import result_row

    write_run([result_row("A", "linear", 0.5), result_row("B", "linear", 0.3)], tmp_path / "results", "r1")
    why = refused(["plot", "ablation", tmp_path / "results", "--out", tmp_path / "fig"], capsys, tmp_path)
    assert "no intervened backbone" in why


def test_compare_answers_for_hostile_labels_and_refuses_bad_pairs(hostile_results, tmp_path, capsys):
    """`bench compare` on old results with hostile labels leads with the answer — difference,
    interval, verdict — within 100 columns, the long names in its title, not on every line; a pair
    it cannot compare (a backbone not in the results, a backbone with itself, an unknown metric) is
    one line, exit 2."""
    long_name = "L" * 250
    code = main(["compare", "a$^$b", long_name, "--results", str(hostile_results)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = [line for line in captured.out.splitlines() if line.strip()]
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    header = next(line for line in lines if "difference" in line)
    assert all(word in header for word in ("difference", "lo", "hi", "verdict")), header
    assert sum(long_name in line for line in lines) <= 1  # the long name once, in the title, or abbreviated
    for args, why in ((["nosuch", "ok"], "nosuch"), (["ok", "ok"], "ok"), (["ok", "a$^$b", "--metric", "nosuch"], "nosuch")):
        assert why in refused(["compare", *args, "--results", hostile_results], capsys, tmp_path)


def test_a_reports_figures_go_only_into_a_folder_of_its_own(hostile_results, tmp_path, capsys):
    """`report -o PAGE.html` wrote its figure PNGs beside the page, into the user's folder; now into
    `PAGE_files/`, which it makes: a folder of that name holding a file of the user's (even one
    named like a figure), a file or a link in its place, a damaged list, are refused before anything
    is read, with nothing changed; in its own folder a rerun replaces its figures and nothing else."""
    page, figures = tmp_path / "page.html", tmp_path / "page_files"
    ok(["report", hostile_results, "-o", page], capsys)
    assert sorted(p.name for p in figures.iterdir()) == [".files.json", "binding_bars.png", "binding_layers.png"]
    assert not list(tmp_path.glob("*.png"))  # nothing beside the page but the page and its list
    drawn = {p.name: p.read_bytes() for p in figures.iterdir()}
    (figures / "binding_bars.png").write_bytes(b"stale")
    ok(["report", hostile_results, "-o", page], capsys)  # its own figures: drawn again
    assert {p.name: p.read_bytes() for p in figures.iterdir()} == drawn
    (figures / "notes.txt").write_text("mine")
    line = refused(["report", hostile_results, "-o", page], capsys, tmp_path)
    assert f"out: {figures} holds files the report did not write (e.g. 'notes.txt')" in line, line
    (figures / "notes.txt").unlink()
    (figures / ".files.json").write_text("{not json")
    assert "is damaged" in refused(["report", hostile_results, "-o", page], capsys, tmp_path)

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "mine_files").mkdir()
    (mine / "mine_files" / "binding_bars.png").write_bytes(b"my own figure")
    (mine / "file_files").write_text("a file, not a folder")
    empty = tmp_path / "empty"
    empty.mkdir()
    (mine / "link_files").symlink_to(empty)
    for name, why in (("mine", "is not empty and holds no report bench wrote (e.g. 'binding_bars.png')"),
                      ("file", "exists and is not a directory"), ("link", "is a link")):
        line = refused(["report", hostile_results, "-o", mine / f"{name}.html"], capsys, tmp_path)
        assert f"out: {mine / name}_files {why}" in line, line


def test_a_figures_folder_with_nothing_left_to_list_is_removed_unless_a_user_file_is_in_it(tmp_path):
    """A report that draws no figure (only a plugin probe's rows, say) makes no folder, and one
    whose last figures are gone removes its list and its folder; a file of the user's added since
    keeps the folder, untouched."""
    from bench.core.outdir import FolderFiles

    folder = tmp_path / "page_files"
    assert FolderFiles(folder, "out").finish([], prefix="") == [] and not folder.exists()
    for user_file in (False, True):
        files = FolderFiles(folder, "out")
        files.check_folder("report")
        files.claim([folder / "a.png"])
        (folder / "a.png").write_bytes(b"figure")
        files.finish([folder / "a.png"], prefix="")
        if user_file:
            (folder / "notes.txt").write_text("mine")
        assert FolderFiles(folder, "out").finish([], prefix="") == [folder / "a.png"]
        assert sorted(p.name for p in tmp_path.rglob("*")) == (["notes.txt", "page_files"] if user_file else [])


def html_text(path: Path) -> str:
    import html

    return html.unescape(path.read_text())


def test_matplotlib_draws_a_dollar_as_written():
    """Mathtext off only while a figure is drawn: the label's text is its name, and the caller's
    own settings are as they were."""
    import matplotlib

    from leaderboards.board import build_leaderboard
    from leaderboards import plots
    from test_leaderboard import result_row

    drawn = []
    board = build_leaderboard([result_row("a$^$b", "linear", 0.5)])

    def keep(fig, out, *formats):
        fig.canvas.draw()  # lays the ticks out, as saving does
        drawn.extend(t.get_text() for t in fig.axes[0].get_xticklabels())
        return []

    with pytest.MonkeyPatch.context() as m:
        m.setattr(plots, "save_figure", keep)
        plots.probe_bars(board, "unused")
    assert drawn == ["a$^$b"] and matplotlib.rcParams["text.parse_math"] is True


#: Every option that names a file or folder a command writes (or, `cache rm`, deletes from),
#: given empty or as spaces, and the option's name in the refusal. RES: a results folder, DS: a
#: dataset, SRC: a CLEVR source.
EMPTY_OUT = [(["report", "RES", "-o", ""], "out"), (["leaderboard", "RES", "--reference", "--out", ""], "out"),
             (["plot", "layers", "RES", "-o", ""], "out"), (["plot", "bars", "RES", "--out", ""], "out"),
             (["site", "RES", "-o", ""], "out"), (["run", "demo", "--dry-run", "--out", ""], "out"),
             (["run", "demo", "--dry-run", "--out", " "], "out"),
             (["generate", *SMALL, "--out", ""], "out"), (["generate", *SMALL, "-o", " "], "out"),
             (["import", "clevr", "--src", "SRC", "--out", "", *IMPORT], "out"),
             (["import", "vg", "--src", "SRC", "-o", ""], "out"), (["import", "ade20k", "--src", "SRC", "-o", ""], "out"),
             (["preview", "DS", "--out", ""], "out"), (["toys-analysis", "-m", "pixels", "-d", "DS", "--out", ""], "out"),
             (["demo", "--out", ""], "out"), (["demo", "-o", " "], "out"),
             (["evaluate", "-m", "pixels", "-d", "DS", "--probes", "linear", "--results", ""], "results"),
             (["extract", "-m", "pixels", "-d", "DS", "--cache-dir", ""], "cache-dir"),
             (["cache", "rm", "--all", "--cache-dir", ""], "cache-dir")]


@pytest.mark.parametrize("args, what", EMPTY_OUT, ids=lambda a: " ".join(a[:2]) if isinstance(a, list) else a)
def test_an_empty_output_path_is_refused_in_one_line(hostile_results, ds, clevr_src, tmp_path, capsys, monkeypatch,
                                                     args, what):
    """`Path("")` is the working directory: report, leaderboard and plot ended in `PosixPath('.')
    has an empty name` (a traceback); run, site, evaluate, extract (its cache) and demo wrote into
    the working directory; generate, import and preview were refused for what `.` holds, not for
    the empty name; `cache rm --all` looked for entries there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    given = {"RES": hostile_results, "DS": ds, "SRC": clevr_src}
    line = refused([given.get(a, a) for a in args], capsys, tmp_path)
    assert f"bench: error: {what}: empty; name the file or folder to write" == line, line


def test_the_api_refuses_an_empty_output_path_too(ds, clevr_src, tmp_path, monkeypatch):
    """The Python API behind those commands: `generate(out="")` and `import_dataset` were refused
    for what the working directory holds, `evaluate(results="")` wrote its rows into it, and a
    study planned into it."""
    from bench import api
    from bench.core.errors import BenchError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    before = tree(tmp_path)
    calls = {"out": [lambda: api.generate("colorshape", preset="small", out=""),
                     lambda: api.import_dataset("clevr", src=clevr_src, out=" "),
                     lambda: api.plan_study(api.load_study("demo", allow_unset=True), "")],
             "results": [lambda: api.evaluate("pixels", ds, probes="linear", results="")]}
    for what, refusals in calls.items():
        for call in refusals:
            with pytest.raises(BenchError, match=f"^{what}: empty; name the file or folder to write$"):
                call()
    assert tree(tmp_path) == before


def test_a_site_goes_only_into_a_new_or_empty_folder_or_its_own(hostile_results, tmp_path, capsys, monkeypatch):
    """`bench site -o DIR` overwrote a user's `index.html` and `compare.html` in a folder it did not
    make; also through a link to that folder, beside a damaged manifest, and in `.`."""
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("index.html", "compare.html", "notes.txt"):
        (mine / name).write_text(f"my {name}")
    (tmp_path / "link").symlink_to(mine)
    empty_target = tmp_path / "empty-target"
    empty_target.mkdir()
    (tmp_path / "link-to-empty").symlink_to(empty_target)  # never through a link, whatever it points to
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / ".index.html.files.json").write_text("{not json")
    (damaged / "index.html").write_text("my page")
    listed_elsewhere = tmp_path / "linked-page"  # a site folder whose page is a link to a user's file
    listed_elsewhere.mkdir()
    (listed_elsewhere / ".index.html.files.json").write_text(json.dumps({"files": ["index.html"]}))
    (listed_elsewhere / "index.html").symlink_to(mine / "index.html")
    for out, why in ((mine, "is not empty and holds no site bench wrote"),
                     (tmp_path / "link", "is a link"), (tmp_path / "link-to-empty", "is a link"),
                     (damaged, "is damaged"), (listed_elsewhere, "holds files the site did not write")):
        assert why in refused(["site", hostile_results, "-o", out], capsys, tmp_path)
    monkeypatch.chdir(mine)
    assert "out: . is not empty" in refused(["site", hostile_results, "-o", "."], capsys, tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    ok(["site", hostile_results, "-o", "."], capsys)  # an empty folder, then the site's own
    ok(["site", hostile_results, "-o", "."], capsys)
    (empty / "notes.txt").write_text("added by the user")
    assert "holds files the site did not write (e.g. 'notes.txt')" in refused(
        ["site", hostile_results, "-o", "."], capsys, tmp_path)


def test_file_outputs_never_overwrite_a_file_they_did_not_write(hostile_results, tmp_path, capsys):
    """`report -o`, `leaderboard --out` and `plot -o` overwrite only what they wrote (their
    `.NAME.files.json` lists it): a user's file in the way is refused before anything is read;
    their own output is written again."""
    for name in ("page.html", "board.md", "fig.png"):
        (tmp_path / name).write_text(f"my {name}")
    (tmp_path / "dir.html").mkdir()
    for args, name in ((["report", hostile_results, "-o", tmp_path / "page.html"], "page.html"),
                       (["leaderboard", hostile_results, "--out", tmp_path / "board.md"], "board.md"),
                       (["plot", "bars", hostile_results, "-o", tmp_path / "fig"], "fig.png")):
        line = refused(args, capsys, tmp_path)
        assert f"{tmp_path / name} exists and bench did not write it" in line, line
    assert "is a directory" in refused(["report", hostile_results, "-o", tmp_path / "dir.html"], capsys, tmp_path)
    mine = {name: (tmp_path / name).read_bytes() for name in ("page.html", "board.md", "fig.png")}
    for args in (["report", hostile_results, "-o", tmp_path / "out" / "report.html"],
                 ["leaderboard", hostile_results, "--out", tmp_path / "out" / "board.md"],
                 ["plot", "bars", hostile_results, "-o", tmp_path / "out" / "fig"]):
        ok(args, capsys)
        ok(args, capsys)  # its own files: written again
    assert {name: (tmp_path / name).read_bytes() for name in mine} == mine


# -- 11. a study is checked whole before anything is made, writes only into its own folder, ----
# --    and one run at a time holds it ---------------------------------------------------------

_EVALUATE = "[[evaluate]]\nbackbones = {backbones}\n{extra}"
#: An evaluate block's intervention sweep, to fill with a subspace kind, kinds, strengths and controls.
_SWEEP = ("interventions = {{ subspace = {{ kind = '{sub}', layer = 0 }}, kinds = [{kinds}], strengths = [{s}], "
          "controls = [{c}] }}")
#: (case, [datasets] table, backbones, extra evaluate keys, top-level keys, the key path the line
#: names and a piece of its message). Each was refused only after the study's folder (its
#: bench-study.json and an empty results/) was made, naming neither the file nor the key; an
#: empty spec became the study file's folder, a `folder` of ../../escape was written, and a
#: million threads died in libgomp with exit 1.
_STUDY_REFUSALS = [
    ("damaged-path", "[datasets.a]\npath = 'bad'", '["pixels"]', "", "", "datasets.a.path: dataset:", "is damaged"),
    ("damaged-card", "[datasets.a]\npath = 'bad-card'", '["pixels"]', "", "", "datasets.a.path: dataset:",
     "dataset.json is damaged"),
    ("no-import-src", "[datasets.a]\nimport = 'clevr'\nsrc = 'nosuch'", '["pixels"]', "", "", "datasets.a: src:",
     "is not a folder"),
    ("timm-nosuch", "{ds}", '["timm:nosuch"]', "", "", "evaluate[1].backbones[1]: model:", "timm has no model"),
    ("py-no-file", "{ds}", '["py:nosuch.py:make"]', "", "", "evaluate[1].backbones[1]: model:", "no such Python file"),
    ("py-no-function", "{ds}", '["pixels", "py:mine.py:make"]', "", "", "evaluate[1].backbones[2]: model:",
     "defines no function 'make'"),
    ("empty-spec", "{ds}", '["pixels", ""]', "", "", "evaluate[1].backbones[2]: empty spec", ""),
    ("empty-named-spec", "{ds}", '{ a = "pixels", b = " " }', "", "", "evaluate[1].backbones.b.spec: empty spec", ""),
    ("uncached-hub", "{ds}", '["facebook/dinov2-small"]', "", "", "evaluate[1].backbones[1]: model:",
     "not in the local Hugging Face cache"),
    ("fp8", "{ds}", '["pixels"]', "dtype = 'fp8'", "", "evaluate[1]: dtype: unknown 'fp8'", ""),
    ("device-unknown", "{ds}", '["pixels"]', "device = 'tpu'", "", "evaluate[1]: device: unknown 'tpu'", ""),
    ("device-cuda", "{ds}", '["pixels"]', "device = 'cuda'", "", "evaluate[1]: device: cuda requested", ""),
    ("n-train-1e12", "[datasets.a]\ngenerator = 'colorshape'\npreset = 'small'\nn_train = 1000000000000", '["pixels"]',
     "", "", "datasets.a: n_train:", "room for at most"),
    ("n-train-2^70", f"[datasets.a]\ngenerator = 'colorshape'\npreset = 'small'\nn_train = {2**70}", '["pixels"]',
     "", "", "datasets.a: n_train:", "room for at most"),
    ("image-size", "[datasets.a]\ngenerator = 'colorshape'\npreset = 'small'\nimage_size = 100000", '["pixels"]',
     "", "", "datasets.a: image_size:", "at most image_size 46,340 fits"),
    ("folder-escape", "{ds}", '["pixels"]', "", "folder = '../../escape'", "folder: the study's folder", "is not a valid name"),
    ("folder-absolute", "{ds}", '["pixels"]', "", "folder = '/tmp/escape'", "folder: the study's folder", "is not a valid name"),
    ("threads", "{ds}", '["pixels"]', "", "threads = 1000000", "threads: at most", "(this machine's cores)"),
    ("intervention-kind", "{ds}", '["pixels"]', _SWEEP.format(sub="binding", kinds="'scramble'", s="0.5", c=""), "",
     "evaluate[1].interventions.kinds[1]: unknown 'scramble'", "allowed: shuffle, inject, remove"),
    ("intervention-strength", "{ds}", '["pixels"]', _SWEEP.format(sub="binding", kinds="'shuffle'", s="0, 1.5", c=""),
     "", "evaluate[1].interventions.strengths[2]: strength 1.5 outside [0, 1]", ""),
    ("subspace-kind", "{ds}", '["pixels"]', _SWEEP.format(sub="pca", kinds="'shuffle'", s="0.5", c=""), "",
     "evaluate[1].interventions.subspace.kind: unknown 'pca'", "binding, random, feature, shuffled-labels"),
    ("control-kind", "{ds}", '["pixels"]', _SWEEP.format(sub="binding", kinds="'shuffle'", s="0.5", c="'noise'"), "",
     "evaluate[1].interventions.controls[1]: unknown 'noise'", ""),
]


@pytest.mark.parametrize("case, datasets, backbones, extra, top, key, message", _STUDY_REFUSALS,
                         ids=[c[0] for c in _STUDY_REFUSALS])
def test_a_study_is_checked_whole_before_anything_is_made(ds, tmp_path, tmp_path_factory, capsys, monkeypatch,
                                                           memory_8gib, case, datasets, backbones, extra, top, key,
                                                           message):
    if case == "timm-nosuch":
        pytest.importorskip("timm")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf")))  # an empty hub cache
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.chdir(tmp_path)  # a default folder, had one been made, would be here
    bad = copy(ds, tmp_path, "bad")
    (bad / "test-00000.parquet").write_bytes(b"not a parquet file")
    (copy(ds, tmp_path, "bad-card") / CARD_NAME).write_text('{"cut')
    (tmp_path / "mine.py").write_text("def other():\n    return None\n")
    study = tmp_path / "study.toml"
    study.write_text(f"{top}\n" + datasets.format(ds=f"[datasets.a]\npath = '{ds}'") + "\n"
                     + _EVALUATE.format(backbones=backbones, extra=extra))
    for out in (["--out", tmp_path / "out"], []):
        line = refused(["run", study, *out], capsys, tmp_path)  # nothing made: no folder, manifest or results/
        assert line.startswith(f"bench: error: {study}: {key}") and message in line, line


def _ok_study(tmp_path: Path, ds: Path) -> Path:
    study = tmp_path / "ok.toml"
    study.write_text(f"[datasets.a]\npath = '{ds}'\n[[evaluate]]\nbackbones = ['pixels', 'oracle:objects']\n"
                     "probes = ['linear']\nepochs = 1\n")
    return study


@pytest.mark.parametrize("kind", ["notes", "symlink", "damaged", "not-a-study", "working-directory"])
def test_a_study_writes_only_into_a_folder_it_made(ds, tmp_path, capsys, monkeypatch, kind):
    """`bench run STUDY --out DIR` wrote its manifest and results/ into any folder: the user's
    notes, one reached through a symbolic link, one whose bench-study.json is damaged, `.`."""
    study = _ok_study(tmp_path, ds)
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    out = {"notes": user, "symlink": tmp_path / "link", "damaged": tmp_path / "dmg", "not-a-study": tmp_path / "dmg",
           "working-directory": Path(".")}[kind]
    if kind == "symlink":
        out.symlink_to(tmp_path / "empty", target_is_directory=True)
        (tmp_path / "empty").mkdir()
    elif kind in ("damaged", "not-a-study"):
        out.mkdir()
        (out / "bench-study.json").write_text("{cut sh" if kind == "damaged" else '["a list"]')
    elif kind == "working-directory":
        monkeypatch.chdir(user)
    for dry in ([], ["--dry-run"]):
        line = refused(["run", study, "--out", out, *dry], capsys, tmp_path)
        what = {"notes": "is not empty and no study made it", "symlink": "is a symbolic link",
                "damaged": "bench-study.json is damaged", "not-a-study": "bench-study.json is damaged",
                "working-directory": "is not empty and no study made it"}[kind]
        assert line.startswith(f"bench: error: out: {out}") and what in line, line


@pytest.mark.slow
def test_a_study_runs_in_an_empty_folder_it_is_given_and_again_in_its_own(ds, tmp_path, capsys, monkeypatch):
    study = _ok_study(tmp_path, ds)
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    ok(["run", study, "--out", "."], capsys)
    ok(["run", study, "--out", "."], capsys)  # its own folder now
    assert len(read_rows(tmp_path / "empty" / "results")) == 2


def read_rows(results: Path) -> list[dict]:
    from bench.core.results import read_results

    return read_results(results).to_pylist()


@pytest.mark.slow
def test_a_second_run_of_a_study_folder_is_refused_naming_the_running_one(ds, tmp_path, capsys):
    """Two `bench run` of one study into one folder at once both fitted every row (8 rows for 4 keys)."""
    from bench import api
    from bench.studies.runner import _claimed

    study = _ok_study(tmp_path, ds)
    out = tmp_path / "out"
    with _claimed(out, api.load_study(study), "bench run ok.toml --out out (the first)"):
        line = refused(["run", study, "--out", out], capsys, tmp_path)
    assert f"out: {out} is being written by another bench run (pid {os.getpid()}, bench run ok.toml --out out " \
           "(the first), since " in line, line
    assert not (out / "results").exists()
    ok(["run", study, "--out", out], capsys)  # the lock died with its holder's run
    ok(["run", study, "--out", out], capsys)
    rows = read_rows(out / "results")
    assert len(rows) == 2 and {r["backbone"] for r in rows} == {"pixels", "oracle:objects"}


def test_an_unknown_task_is_one_line_listing_the_tasks(capsys, tmp_path):
    """`--task` and a study block's `task` are names of the task registry (bench/core/tasks.py):
    an unknown one is refused before anything is read, in one line that lists every task."""
    line = refused(["evaluate", "-m", "pixels", "-d", tmp_path, "--task", "depth"], capsys, tmp_path)
    assert line == "bench: error: task: unknown 'depth'; allowed: binding, issameobject, objective, segmentation", line
    study = tmp_path / "s.toml"
    study.write_text("[datasets.a]\ngenerator = 'colorshape'\n[[evaluate]]\nbackbones = ['pixels']\n"
                     "task = 'depth'\n")
    line = refused(["run", study, "--dry-run"], capsys)
    assert line.endswith("evaluate[1].task: unknown task 'depth'; allowed: binding, issameobject, objective, segmentation"), line


@pytest.mark.parametrize("model, extra, message", [
    ("pixels", [], "objective: pixels has no head (only zoo models publish"),
    ("zoo:untrained", [], "objective: zoo:untrained has no objective"),
    ("zoo:features", [], "objective: zoo:features has no head ("),  # a folder trained before heads were published
    ("zoo:untrained", ["--layers", "1"], "layers: the objective task reads the last hidden state"),
])
def test_the_objective_of_a_backbone_without_a_head(tmp_path, capsys, monkeypatch, balanced_small, model, extra,
                                                    message):
    """`--task objective` needs the model's own training head: a backbone without one, the untrained
    control and a layer other than the head's input are refused before anything is written."""
    from tests.test_zoo import use_tiny_zoo

    use_tiny_zoo(tmp_path, monkeypatch)
    if model == "zoo:features":
        assert main(["zoo", "train", "features"]) == 0
        shutil.rmtree(Path(capsys.readouterr().out.strip()) / "head")
    elif model == "zoo:untrained":
        assert main(["zoo", "train", "untrained"]) == 0
        capsys.readouterr()
    msg = refused(["evaluate", "--task", "objective", "--model", model, "--dataset", balanced_small, *extra,
                   "--results", tmp_path / "results"], capsys, tmp_path / "results")
    assert message in msg, msg
    assert not list((tmp_path / "results").glob("*.parquet"))


# ---------------------------------------------------------------- interventions (issue 58)


@pytest.fixture(scope="module")
def hooked_toy(tmp_path_factory, ds) -> tuple[str, Path]:
    """A `py:` toy backbone and a random subspace of its layer 1 fitted on `ds`."""
    from bench import api
    from tests.toy_backbones import EVERY_BLOCK

    root = tmp_path_factory.mktemp("intervene")
    (root / "toy.py").write_text(toy_module("[torch.nn.Linear(24, 24) for _ in range(2)]", EVERY_BLOCK))
    (root / "other").mkdir()
    (root / "other" / "toy.py").write_text(toy_module("[torch.nn.Linear(24, 24) for _ in range(3)]", EVERY_BLOCK))
    spec = f"py:{root / 'toy.py'}:make"
    sub = api.fit_subspace(spec, ds, 1, kind="random", rank=3, progress=False)
    return spec, api.save_subspace(sub, root / "sub.npz")


@pytest.mark.parametrize("case, message", [
    ("layer", "has hidden states 0..2; no layer 5"),
    ("fitted-layer", "was fitted at layer 1, not 2"),
    ("backbone", "was fitted on py:"),
    ("strength", "strength must be in [0, 1], got 1.5"),
    ("pixels", "has no transformer blocks to hook"),
    ("oracle", "has no transformer blocks to hook"),
    ("comma", "is not key=value"),
    ("kind", "unknown option 'scramble'"),
])
def test_intervention_bad_specs_are_one_line(case, message, hooked_toy, ds, tmp_path, capsys):
    spec, sub = hooked_toy
    specs = {
        "layer": f"intervene:shuffle=0.5,layer=5,subspace={sub}:{spec}",
        "fitted-layer": f"intervene:shuffle=0.5,layer=2,subspace={sub}:{spec}",
        "backbone": f"intervene:shuffle=0.5,layer=1,subspace={sub}:py:{Path(spec[3:-5]).parent / 'other' / 'toy.py'}:make",
        "strength": f"intervene:shuffle=1.5,layer=1,subspace={sub}:{spec}",
        "pixels": f"intervene:shuffle=0.5,layer=1,subspace={sub}:pixels",
        "oracle": f"intervene:remove=1,layer=1,subspace={sub}:oracle:objects",
        "comma": f"intervene:shuffle=0.5,layer=1,subspace=a,b.npz:{spec}",
        "kind": f"intervene:scramble=0.5,layer=1,subspace={sub}:{spec}",
    }
    line = refused(["extract", "--model", specs[case], "--dataset", ds, "--tokens", "all",
                    "--cache-dir", tmp_path / "cache"], capsys, tmp_path)
    assert message in line, line


def test_intervention_on_another_dataset_is_refused(hooked_toy, tmp_path, capsys):
    spec, sub = hooked_toy
    other = make_dataset(tmp_path / "other", n_train=4, n_val=2, n_test=2)
    line = refused(["extract", "--model", f"intervene:shuffle=0.5,layer=1,subspace={sub}:{spec}", "--dataset", other,
                    "--tokens", "all", "--cache-dir", tmp_path / "cache"], capsys, tmp_path)
    assert "was fitted on" in line and "train fingerprint" in line, line


def test_inject_needs_instance_masks(hooked_toy, ds, tmp_path, capsys):
    """A dataset whose card says its masks are boxes (an import) has no instance masks to inject."""
    spec, sub = hooked_toy
    boxes = tmp_path / "boxes"
    shutil.copytree(ds, boxes)
    card = json.loads((boxes / CARD_NAME).read_text())
    (boxes / CARD_NAME).write_text(json.dumps({**card, "provenance": {"mask": "boxes: each object's box"}}))
    line = refused(["extract", "--model", f"intervene:inject=0,layer=1,subspace={sub}:{spec}", "--dataset", boxes,
                    "--tokens", "all", "--cache-dir", tmp_path / "cache"], capsys, tmp_path / "cache")
    assert "inject reads instance masks" in line and "(boxes)" in line, line
    assert not (tmp_path / "cache").exists()


def test_subspace_command_refusals(hooked_toy, ds, tmp_path, capsys):
    spec, sub = hooked_toy
    foreign = tmp_path / "notes.npz"
    foreign.write_text("mine")
    assert "not a subspace file; it is left alone" in refused(
        ["subspace", ds, "--model", spec, "--layer", "1", "--out", foreign], capsys, tmp_path)
    assert "exists; pass --overwrite" in refused(["subspace", ds, "--model", spec, "--layer", "1", "--out", sub],
                                                  capsys, tmp_path)
    assert "no layer 9" in refused(["subspace", ds, "--model", spec, "--layer", "9", "--out", tmp_path / "s.npz"],
                                   capsys, tmp_path)
    assert "unknown subspace kind" in refused(["subspace", ds, "--model", spec, "--layer", "1", "--kind", "nope",
                                               "--out", tmp_path / "s.npz"], capsys, tmp_path)
    assert "not a subspace file" in refused(["subspace", "angles", sub, foreign], capsys, tmp_path)
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(Path(sub).read_bytes()[:300])
    assert "is not a subspace file (BadZipFile" in refused(["subspace", "angles", truncated, sub], capsys, tmp_path)
    blocked = tmp_path / "a-file"
    blocked.write_text("mine")
    assert "is not a writable folder" in refused(["subspace", ds, "--model", spec, "--layer", "1", "--out",
                                                  blocked / "s.npz"], capsys, tmp_path)  # said before any fit
    assert blocked.read_text() == "mine"


def test_segmentation_without_a_patch_grid_or_with_pooled_tokens_is_one_line(ds, tmp_path, capsys):
    """The segmentation task labels every patch: a backbone with no patch grid, or a pooled tokens
    choice, is refused in one line, no rows written."""
    run = ["evaluate", "--task", "segmentation", "--dataset", ds, "--results", tmp_path / "r", "--threads", "1"]
    assert "no spatial tokens" in failed([*run, "--model", "oracle:objects"], capsys)
    assert "use --tokens all" in refused([*run, "--model", "pixels", "--tokens", "cls"], capsys)
    assert "unknown 'linear'" in refused([*run, "--model", "pixels", "--probes", "linear"], capsys)
    assert not list((tmp_path / "r").glob("*.parquet"))


@pytest.mark.parametrize("size, message", [("1 GiB of it", "expected bytes or a size such as 512MiB or 1GiB"),
                                           ("0", "must be at least one byte"), ("-1GiB", "expected bytes")])
def test_a_bad_memory_budget_is_one_line(tmp_path, capsys, size, message):
    line = refused(["evaluate", "-m", "pixels", "-d", tmp_path, "--memory-budget", size], capsys, tmp_path)
    assert line.startswith("bench: error: memory budget: ") and message in line, line


def test_a_memory_budget_below_one_batch_of_rows_is_one_line(balanced_small, tmp_path, capsys):
    line = failed(["evaluate", "-m", "pixels:8", "-d", balanced_small, "--probes", "linear", "--device", "cpu",
                   "--epochs", "1", "--results", tmp_path / "r", "--memory-budget", "1KiB"], capsys)
    assert line == ("bench: error: memory budget: 1.0 KiB cannot read one batch of rows (32 rows of 192 values); "
                    "give at least 36.0 KiB"), line
