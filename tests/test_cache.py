"""Activation cache: identity (same name, different weights never share), superset reuse,
resume after a kill, memory-mapped reads, and `bench cache ls|rm`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from test_backbones import TINY, tiny_checkpoint

from bench.cli import main
from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from evaluators.cache import entries as cache, inventory as cache_inventory
from evaluators.backbones import PRESETS, resolve_backbone
from evaluators.backbones.hf import HFBackbone
from evaluators.backbones.presets import Preset
from evaluators.cache.extract import extract_activations, extract_selections


@pytest.fixture(scope="module")
def ds(uniform_small) -> Dataset:
    return Dataset(uniform_small)


def extract(spec, ds, cache_dir, split="test", **kw):
    return extract_activations(spec, ds, split, cache_dir=cache_dir, progress=False, **kw)


def forbid_forward(monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("cache miss: the model ran")

    monkeypatch.setattr(HFBackbone, "hidden_states", fail)


def test_same_name_different_weights_never_share_an_entry(ds, tmp_path, monkeypatch):
    ckpt, store = tmp_path / "model", tmp_path / "cache"
    tiny_checkpoint("dinov2", ckpt, seed=0)
    a = extract(str(ckpt), ds, store, layers="last")
    a_values = np.array(a.get(2, "cls"))
    tiny_checkpoint("dinov2", ckpt, seed=1)  # same path, same name, other weights
    b = extract(str(ckpt), ds, store, layers="last")
    assert b.path != a.path and not np.allclose(a_values, b.get(2, "cls"))
    tiny_checkpoint("dinov2", ckpt, seed=0)  # the first weights again: a cache hit, no forward pass
    with monkeypatch.context() as m:
        forbid_forward(m)
        again = extract(str(ckpt), ds, store, layers="last")
    assert again.path == a.path
    np.testing.assert_array_equal(again.get(2, "cls"), a_values)


def test_key_covers_seed_split_dtype_and_resolution(ds, tmp_path, monkeypatch):
    monkeypatch.setitem(PRESETS, "tiny", Preset("none/tiny", "dinov2", 32, {**TINY, "mlp_ratio": 2}))
    base = dict(layers="last")
    paths = {
        "seed0": extract("random:tiny", ds, tmp_path, **base).path,
        "seed1": extract(resolve_backbone("random:tiny", seed=1), ds, tmp_path, **base).path,
        "val": extract("random:tiny", ds, tmp_path, split="val", **base).path,
        "bf16": extract("random:tiny", ds, tmp_path, dtype="bf16", **base).path,
        "48px": extract("random:tiny", ds, tmp_path, image_size=48, **base).path,
    }
    assert len({p.parent for p in paths.values()}) == len(paths)  # five different base keys


def test_a_superset_entry_serves_smaller_requests(ds, tmp_path, monkeypatch):
    ckpt = tiny_checkpoint("dinov2", tmp_path / "m")[1]
    full = extract(str(ckpt), ds, tmp_path, layers="all", token_choices=("cls+mean", "all"))
    forbid_forward(monkeypatch)
    part = extract(str(ckpt), ds, tmp_path, layers="mid", token_choices=("mean",))
    assert part.path == full.path and part.layers == [1]
    np.testing.assert_array_equal(part.get(1, "mean"), full.get(1, "cls+mean")[:, 32:])
    hit = extract(str(ckpt), ds, tmp_path, layers="last", token_choices=("cls", "mean", "all", "cls+mean"))
    assert hit.path == full.path
    with pytest.raises(AssertionError, match="cache miss"):  # another input side is another entry
        extract(str(ckpt), ds, tmp_path, layers="last", token_choices=("cls",), image_size=48)


def test_one_forward_pass_fills_every_selection_with_the_bytes_of_its_own_pass(ds, tmp_path, monkeypatch):
    """A study's two selections (every layer's cls,mean; every token of the last layer) from one
    forward pass a batch: each is its own entry, byte for byte what its own extraction writes (one
    asked for twice is one entry), and a second call finds both without running the model."""
    ckpt = tiny_checkpoint("dinov2", tmp_path / "m")[1]
    wanted = [("all", ("cls", "mean")), ("last", ("all",))]
    alone = [extract(str(ckpt), ds, tmp_path / "alone", layers=layers, token_choices=tokens)
             for layers, tokens in wanted]
    passes = []
    forward = HFBackbone.hidden_states
    monkeypatch.setattr(HFBackbone, "hidden_states", lambda self, x, layers: passes.append(layers) or
                        forward(self, x, layers))
    both = extract_selections(str(ckpt), ds, "test", [*wanted, wanted[0]], cache_dir=tmp_path / "both",
                              progress=False)  # a selection asked twice is one entry, one writer
    assert passes == [[0, 1, 2]] * -(-ds.num_rows("test") // 32)  # one pass a batch, every layer of both
    assert both[2].path == both[0].path
    for one, got in zip(alone, both):
        assert got.path.name == one.path.name and got.layers == one.layers and got.token_choices == one.token_choices
        arrays = sorted(one.path.glob("*.npy"))
        assert len(arrays) == len(one.layers) * len(one.token_choices)
        for f in arrays:
            assert (got.path / f.name).read_bytes() == f.read_bytes(), f.name
    forbid_forward(monkeypatch)
    again = extract_selections(str(ckpt), ds, "test", wanted[::-1], cache_dir=tmp_path / "both", progress=False)
    assert [a.path for a in again] == [b.path for b in both[1::-1]]


def test_reads_are_read_only_memmaps(ds, tmp_path):
    acts = extract("oracle:patches", ds, tmp_path, token_choices=("all",))
    arr = acts.get(0, "all")
    assert isinstance(arr, np.memmap) and arr.dtype == np.float16 and arr.shape == (20, 16, 8 + 1)  # one-hots + background flag
    with pytest.raises(ValueError):
        arr[0, 0, 0] = 1


def test_a_writer_that_waited_never_touches_the_finished_entry(ds, tmp_path):
    acts = extract("oracle:objects", ds, tmp_path)
    before = np.array(acts.get(0, "cls"))
    assert before.sum() > 0
    writer = cache.EntryWriter(acts.path, {}, [0], ["cls"], 20, {"cls": (16,)}).open()
    writer.close()
    assert writer.n_done == 20
    np.testing.assert_array_equal(acts.get(0, "cls"), before)


STALLED_RUN = """
import sys, time
from bench.core.dataset import Dataset
from evaluators.backbones.hf import HFBackbone
from evaluators.cache.extract import extract_activations, extract_selections

forward, batches = HFBackbone.hidden_states, []
def stalled(self, x, layers):  # after four batches (8 rows), the run stays mid-extraction until it is killed
    batches.append(len(x))
    if len(batches) > 4:
        time.sleep(600)
    return forward(self, x, layers)
HFBackbone.hidden_states = stalled
ckpt, data, store = sys.argv[1:]
extract_activations(ckpt, Dataset(data), "train", token_choices=("cls", "all"), batch_size=2, cache_dir=store,
                    progress=False)
"""


@pytest.mark.slow
def test_killed_extraction_resumes_and_matches_an_uninterrupted_run(ds, tmp_path, monkeypatch):
    ckpt = tiny_checkpoint("dinov2-reg", tmp_path / "m")[1]
    store, script = tmp_path / "cache", tmp_path / "stalled.py"
    script.write_text(textwrap.dedent(STALLED_RUN))
    proc = subprocess.Popen([sys.executable, str(script), str(ckpt), str(ds.path), str(store)])
    try:
        n_done = _wait_for_rows(store, proc, at_least=6)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    [entry] = cache_inventory.list_entries(store)
    assert not entry.complete and cache.read_meta(entry.path) is None
    n_done = json.loads((entry.path / cache.STATE_NAME).read_text())["n_done"]
    assert 6 <= n_done <= 8
    rows_run = []
    forward = HFBackbone.hidden_states
    monkeypatch.setattr(HFBackbone, "hidden_states", lambda self, x, l: rows_run.append(len(x)) or forward(self, x, l))
    resumed = extract(str(ckpt), ds, store, split="train", token_choices=("cls", "all"), batch_size=2)
    assert sum(rows_run) == 40 - n_done  # only the missing rows ran
    assert resumed.path == entry.path and cache_inventory.list_entries(store)[0].complete
    fresh = extract(str(ckpt), ds, tmp_path / "fresh", split="train", token_choices=("cls", "all"), batch_size=2)
    for layer in (0, 2):
        for tokens in ("cls", "all"):
            np.testing.assert_array_equal(resumed.get(layer, tokens), fresh.get(layer, tokens))


def _wait_for_rows(store: Path, proc: subprocess.Popen, at_least: int, timeout: float = 300) -> int:
    """The rows the extraction has recorded, once at least `at_least` (`timeout` guards a hang only)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the extraction finished before it could be killed"
        for state in store.glob(f"activations/*/*/{cache.STATE_NAME}"):
            try:
                n = json.loads(state.read_text())["n_done"]
            except (OSError, ValueError):
                continue
            if n >= at_least:
                return n
        time.sleep(0.05)
    raise AssertionError("extraction made no progress")


def test_cache_ls_and_rm(ds, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path))
    extract("oracle:objects", ds, None)
    extract("oracle:features", ds, None)
    partial = cache.EntryWriter(tmp_path / "activations" / ("f" * 32) / "x", {"spec": "pixels"}, [0], ["cls"], 20,
                                {"cls": (3,)}).open()
    partial.close()
    assert main(["cache", "ls", "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted((r["backbone"], r["status"]) for r in listed) == [
        ("oracle:features", "complete"), ("oracle:objects", "complete"), ("pixels", "partial")]
    assert next(r for r in listed if r["status"] == "partial")["rows"] == "0/20"
    assert main(["cache", "rm", "--partial"]) == 0
    assert len(cache_inventory.list_entries()) == 2
    objects = next(r["key"] for r in listed if r["backbone"] == "oracle:objects")
    assert main(["cache", "rm", objects[:8]]) == 0
    assert [e.backbone for e in cache_inventory.list_entries()] == ["oracle:features"]
    capsys.readouterr()
    assert main(["cache", "rm", "nosuchkey"]) == 2 and "nosuchkey" in capsys.readouterr().err
    assert main(["cache", "rm"]) == 2
    assert main(["cache"]) == 0 and "ls" in capsys.readouterr().out
    assert main(["cache", "rm", "--all"]) == 0 and cache_inventory.list_entries() == []
    with pytest.raises(BenchError):
        cache_inventory.select_entries([], ["x"])
    assert os.listdir(tmp_path / "activations") == []


# -- row shards: several writers fill one entry (the Ray executor's extraction units) ------------


@pytest.fixture(scope="module")
def odd_files(tmp_path_factory) -> Dataset:
    """A split stored in shard files of 7 rows, so file and batch boundaries disagree."""
    from tests.helpers import make_dataset

    return Dataset(make_dataset(tmp_path_factory.mktemp("odd") / "ds", n_train=40, n_val=8, n_test=8,
                                image_size=32, n_colors=3, n_shapes=3, colors_per_scene=2,
                                shapes_per_scene=2, n_objects=3, object_size=8, margin=1, shard_size=7))


def test_batches_are_cut_on_multiples_of_the_batch_size_whatever_the_files(odd_files, monkeypatch):
    import pyarrow.parquet as pq

    from evaluators.cache.extract import _batches

    whole = [(o, len(c["image"])) for o, c in _batches(odd_files, "train", ["image"], 8)]
    assert whole == [(0, 8), (8, 8), (16, 8), (24, 8), (32, 8)]
    whole_rows = [i for _, c in _batches(odd_files, "train", ["index"], 8) for i in c["index"]]
    read, iter_batches = [], pq.ParquetFile.iter_batches
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", lambda self, **kw: read.append(1) or iter_batches(self, **kw))
    shard = list(_batches(odd_files, "train", ["index"], 8, skip=16, stop=37))
    assert [(o, len(c["index"])) for o, c in shard] == [(16, 8), (24, 8), (32, 5)]
    assert [i for _, c in shard for i in c["index"]] == whole_rows[16:37]
    assert len(read) == 4  # the files of rows 14..20, 21..27, 28..34, 35..39: those before row 16 are not read
    assert [(o, len(c["image"])) for o, c in _batches(odd_files, "train", ["image"], 8, skip=13, stop=20)] == [
        (13, 3), (16, 4)]


def test_row_shards_in_any_order_fill_the_entry_a_whole_run_fills(odd_files, tmp_path):
    from evaluators.cache.extract import is_complete, row_shards

    ckpt = tiny_checkpoint("dinov2-reg", tmp_path / "m")[1]
    shards = row_shards(40, 12, batch_size=8)
    assert shards == [(0, 16), (16, 32), (32, 40)]
    store, kw = tmp_path / "shards", dict(split="train", token_choices=("cls", "all"), batch_size=8)
    first = extract(str(ckpt), odd_files, store, rows=shards[1], **kw)
    assert not is_complete(first) and first.n == 40
    state = json.loads((first.path / cache.STATE_NAME).read_text())
    assert state["done"] == [[16, 32]] and state["n_done"] == 16
    assert extract(str(ckpt), odd_files, store, rows=shards[2], **kw).path == first.path
    assert [e.rows for e in cache_inventory.list_entries(store)] == ["24/40"]
    last = extract(str(ckpt), odd_files, store, rows=shards[0], **kw)
    assert is_complete(last) and not (last.path / cache.STATE_NAME).exists()
    whole = extract(str(ckpt), odd_files, tmp_path / "whole", **kw)
    for layer in (0, 2):
        for tokens in ("cls", "all"):
            assert np.array_equal(last.get(layer, tokens), whole.get(layer, tokens))  # the same batches, bit for bit
    with pytest.raises(BenchError, match="batch boundary"):
        extract(str(ckpt), odd_files, store, rows=(4, 16), **kw)
    with pytest.raises(BenchError, match="row shard"):
        extract(str(ckpt), odd_files, store, rows=(32, 48), **kw)


def test_concurrent_shard_writers_share_one_entry(odd_files, tmp_path, monkeypatch):
    """Two writers at once (threads: each holds its own locks, as two processes would); the
    entry is complete exactly once, and `cache rm` refuses it while either writes."""
    import threading

    from evaluators.cache.extract import is_complete

    ckpt = tiny_checkpoint("dinov2", tmp_path / "m")[1]
    store, kw = tmp_path / "cache", dict(split="train", token_choices=("cls",), batch_size=8)
    forward, both_writing, first = HFBackbone.hidden_states, threading.Barrier(2, timeout=60), threading.local()
    refused = []

    def slow(self, x, layers):
        if not getattr(first, "done", False):  # each writer's first batch: wait until both write, then try rm
            first.done = True
            both_writing.wait()
            entries = cache_inventory.list_entries(store)
            with pytest.raises(BenchError, match="being written"):
                cache_inventory.remove_entries(entries)
            refused.append(len(entries))
        time.sleep(0.05)
        return forward(self, x, layers)

    monkeypatch.setattr(HFBackbone, "hidden_states", slow)
    out: dict = {}
    def write(rows: tuple[int, int]) -> None:
        out[rows] = extract(str(ckpt), odd_files, store, rows=rows, **kw)

    threads = [threading.Thread(target=write, args=(r,)) for r in [(0, 24), (24, 40)]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert refused and all(n == 1 for n in refused)
    assert is_complete(out[0, 24]) and out[0, 24].path == out[24, 40].path
    monkeypatch.setattr(HFBackbone, "hidden_states", forward)
    whole = extract(str(ckpt), odd_files, tmp_path / "whole", **kw)
    assert np.array_equal(out[0, 24].get(2, "cls"), whole.get(2, "cls"))


def test_a_partial_entry_of_the_single_writer_format_resumes_after_its_rows(ds, tmp_path):
    """state.json written before row shards existed held only `n_done`: its first rows are kept."""
    writer = cache.EntryWriter(tmp_path / "e", {}, [0], ["cls"], 20, {"cls": (4,)}).open()
    writer.write(0, {(0, "cls"): np.ones((6, 4))})
    writer.close()
    state = json.loads((tmp_path / "e" / cache.STATE_NAME).read_text())
    del state["done"]
    (tmp_path / "e" / cache.STATE_NAME).write_text(json.dumps(state))
    again = cache.EntryWriter(tmp_path / "e", {}, [0], ["cls"], 20, {"cls": (4,)}, rows=(0, 20)).open()
    try:
        assert again.todo() == [(6, 20)] and again.n_done == 6
        assert not again.finish({})
    finally:
        again.close()


def test_a_cache_that_cannot_be_written_is_refused_before_any_work(ds, tmp_path, monkeypatch, capsys):
    """Not one error row per backbone after the fact: exit 2, one line, no results file."""
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "file" / "cache"))
    code = main(["evaluate", "--model", "pixels", "--dataset", str(ds.path), "--results", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "cache ($BINDINGBENCH_CACHE): cannot write" in err
    assert not list((tmp_path / "r").glob("*.parquet"))


@pytest.mark.parametrize("damage", ["array", "state"])
def test_a_damaged_partial_entry_starts_afresh(damage, odd_files, tmp_path):
    """A truncated array (or state.json) in a partial entry: the next extraction rewrites every
    row instead of failing on it run after run, and equals an undamaged run."""
    from evaluators.cache.extract import is_complete

    ckpt = tiny_checkpoint("dinov2", tmp_path / "m")[1]
    store, kw = tmp_path / "cache", dict(split="train", token_choices=("cls",), batch_size=8)
    part = extract(str(ckpt), odd_files, store, rows=(0, 16), **kw)
    victim = next(part.path.glob("*.npy")) if damage == "array" else part.path / cache.STATE_NAME
    victim.write_bytes(victim.read_bytes()[:20])
    full = extract(str(ckpt), odd_files, store, **kw)
    assert is_complete(full) and full.path == part.path
    fresh = extract(str(ckpt), odd_files, tmp_path / "fresh", **kw)
    assert np.array_equal(full.get(2, "cls"), fresh.get(2, "cls"))


def test_a_recorded_backbone_reads_a_warm_cache_without_building_its_model(ds, tmp_path, monkeypatch):
    """A `random:` preset built once is recorded (info, identity); the next plan of the same spec and
    options is that record, whose cache keys are the built model's, so a warm cache is read with no
    model built, and a miss builds it and extracts under the built model's own key."""
    from evaluators.backbones.recorded import RecordedBackbone, planned_backbone

    monkeypatch.setitem(PRESETS, "tiny", Preset("none/tiny", "dinov2", 32, {**TINY, "mlp_ratio": 2}))
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "records"))
    built: list[dict] = []

    def build(**options):
        built.append(options)
        return resolve_backbone("random:tiny", **options)

    first = planned_backbone("random:tiny", {}, build)
    test = extract(first, ds, tmp_path, layers="last")
    again = planned_backbone("random:tiny", {}, build)
    assert isinstance(first, HFBackbone) and isinstance(again, RecordedBackbone) and built == [{}]
    assert again.info == first.info and again.identity() == first.identity()
    hit = extract(again, ds, tmp_path, layers="last")
    assert built == [{}] and hit.path == test.path
    np.testing.assert_array_equal(hit.get(2, "cls"), test.get(2, "cls"))
    missed = extract(again, ds, tmp_path, split="val", layers="last")  # a miss: the model is built to extract
    assert built == [{}, {}] and missed.path == extract(first, ds, tmp_path, split="val", layers="last").path
    wider = planned_backbone("random:tiny", {"image_size": 48}, lambda: build(image_size=48))  # another record
    assert isinstance(wider, HFBackbone) and wider.info.input_size == 48 and built[-1] == {"image_size": 48}


def test_a_backbone_planned_on_a_cache_it_cannot_write_is_built_and_not_recorded(tmp_path, monkeypatch):
    """The record is an optimisation: a cache root it cannot be written under (here a path below a file;
    a read-only shared cache alike) gives the built backbone, as before records, not an OSError."""
    from evaluators.backbones.recorded import RECORDS_DIR, planned_backbone

    monkeypatch.setitem(PRESETS, "tiny", Preset("none/tiny", "dinov2", 32, {**TINY, "mlp_ratio": 2}))
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "a-file" / "cache"))
    got = planned_backbone("random:tiny", {}, lambda: resolve_backbone("random:tiny"))
    assert isinstance(got, HFBackbone) and got.info.width == resolve_backbone("random:tiny").info.width
    assert not (tmp_path / "a-file" / "cache" / RECORDS_DIR).exists()
