"""Torch threads: the free cores by default (never more threads than free cores), `--threads`
outright, said once on stderr."""

from __future__ import annotations

import pytest
import torch

from bench.cli import main
from bench.core.errors import BenchError
from evaluators.runner import threads
from tests.helpers import TINY_SCENES, make_dataset


@pytest.mark.parametrize("busy, expected", [(0.05, 2), (0.3, 1), (1.0, 1), (1.2, 1), (6.0, 1)])
def test_the_default_takes_the_cores_other_work_leaves_free(monkeypatch, busy, expected):
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads, "busy_cores", lambda cpus, window_s=0: busy)
    choice = threads.choose_threads(None)
    assert choice.threads == expected and f"{busy:.1f} busy" in choice.why


def test_busy_cores_is_the_non_idle_share_of_each_sampled_cpu(monkeypatch):
    samples = iter([{0: (100, 200), 1: (100, 200)}, {0: (150, 300), 1: (200, 300)}])
    monkeypatch.setattr(threads, "_cpu_times", lambda cpus: next(samples))
    assert threads.busy_cores([0, 1], window_s=0) == pytest.approx(0.5)  # cpu 0 half busy, cpu 1 idle


def test_proc_stat_is_read_for_the_cpus_asked():
    times = threads._cpu_times([0])
    if times is None:
        pytest.skip("no /proc/stat on this system")
    assert list(times) == [0] and times[0][1] >= times[0][0] > 0


def test_threads_asked_for_are_used_and_bad_counts_refused(monkeypatch):
    monkeypatch.setattr(threads, "machine_cores", lambda: 4)
    assert threads.choose_threads(3).threads == 3 and threads.choose_threads(4).threads == 4
    with pytest.raises(BenchError, match="threads: must be ≥ 1"):
        threads.choose_threads(0)
    with pytest.raises(BenchError, match="threads: at most 4 \\(this machine's cores\\), got 5"):
        threads.choose_threads(5)


def test_evaluate_says_its_thread_count_once_and_restores_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(threads, "machine_cores", lambda: 4)  # 3 threads on any machine
    data = make_dataset(tmp_path / "d", n_train=24, n_val=8, n_test=8, **TINY_SCENES)
    before = torch.get_num_threads()
    seen = []
    import evaluators.tasks.binding.workers as workers

    real = workers.binding_rows  # where the probes train in this process
    monkeypatch.setattr(workers, "binding_rows", lambda *a, **k: (seen.append(torch.get_num_threads()), real(*a, **k))[1])
    args = ["evaluate", "--dataset", str(data), "--model", "oracle:objects", "--probes", "linear", "--epochs", "1",
            "--results", str(tmp_path / "r")]
    assert main([*args, "--threads", "3"]) == 0
    err = capsys.readouterr().err
    assert err.count("threads: ") == 1
    assert "threads: 3 torch threads (--threads); probes fit on one (the same numbers on any count)" in err
    assert seen == [3] and torch.get_num_threads() == before
    assert main([*args, "--overwrite"]) == 0
    assert capsys.readouterr().err.count("torch thread") == 1
    assert main([*args, "--threads", "0"]) == 2
    err = capsys.readouterr().err
    assert "threads: must be ≥ 1, got 0" in err and len(err.strip().splitlines()) == 1
    assert main([*args, "--model", "nosuch:thing"]) == 2  # bad input: its one line, no thread line before it
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_row_set_gets_the_same_numbers_on_any_thread_count(tmp_path):
    """A probe fit on a CPU runs on one torch thread whatever the caller set (torch splits large
    reductions between its threads, and their rounding moved a row set's numbers): fitted at one
    thread and at three, every metric, test bit and chosen setting is the same."""
    import numpy as np

    from bench.core.dataset import Dataset
    from evaluators.tasks.binding.task import binding_task
    from evaluators.tasks.binding.columns import evaluate_binding
    from evaluators.tasks.binding.task import SPLITS
    from evaluators.fitting import RowReader, TrainConfig
    from tests.test_stacking import _numbers

    task = binding_task(Dataset(make_dataset(tmp_path / "ds", n_train=300, n_val=100, n_test=100, image_size=64,
                                             object_size=8, margin=2)))
    rng = np.random.default_rng(0)
    mix = rng.normal(size=(task.codes["train"][1].shape[1], 384)).astype(np.float32)
    inputs = {s: RowReader(task.codes[s][1].astype(np.float32) @ mix
                           + 3 * rng.normal(size=(len(task.codes[s][1]), 384)).astype(np.float32)) for s in SPLITS}
    before = torch.get_num_threads()
    got = {}
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            got[n] = _numbers(evaluate_binding(inputs, task, ["linear", "quadratic"], train=TrainConfig(epochs=6),
                                               n_boot=50))
            assert torch.get_num_threads() == n  # the caller's count is restored
    finally:
        torch.set_num_threads(before)
    assert got[1] == got[3]


@pytest.mark.parametrize("side", [28, 56])  # MKL splits a product between threads by its shape and the processor
def test_activations_are_the_same_bytes_on_any_thread_count(tmp_path, side):
    """The activation cache's key holds no thread count (`--threads` and the default's choice of
    free cores vary from run to run), so a backbone's forward pass must write the same bytes on
    one thread as on two: the fit's own thread independence would count for nothing otherwise."""
    import numpy as np

    from bench.core.dataset import Dataset
    from evaluators.backbones import resolve_backbone
    from evaluators.cache.extract import extract_activations

    ds = Dataset(make_dataset(tmp_path / "ds", n_train=32, **TINY_SCENES))
    backbone = resolve_backbone("random:dinov2-small", image_size=side)  # products big enough for two threads to split
    # (on an AVX-512 Xeon, unpinned MKL rounded the 28-px products by the thread count: `bench.core.numerics`)
    before = torch.get_num_threads()
    got = {}
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            acts = extract_activations(backbone, ds, "train", layers="all", token_choices=("cls+mean", "all"),
                                       device="cpu", cache_dir=tmp_path / f"cache{n}", progress=False)
            got[n] = {(layer, tokens): np.array(acts.get(layer, tokens)) for layer in acts.layers
                      for tokens in ("cls+mean", "all")}
    finally:
        torch.set_num_threads(before)
    assert got[1].keys() == got[2].keys() and len(got[1]) == 26
    for key, values in got[1].items():
        assert values.tobytes() == got[2][key].tobytes(), key
