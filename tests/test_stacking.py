"""Row sets fitted as one batched problem get the numbers each gets alone.

A backbone's layers and tokens choices are stacked into one linear solve (the row set a batch
dimension, `evaluators.fitting.fit_row_sets`); resume, Ray and skipped rows fit subsets of them,
so a row set's rows must not depend on its batch-mates."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from bench.core.dataset import Dataset
from evaluators.tasks.binding.task import binding_task
from evaluators.tasks.binding.columns import evaluate_binding, evaluate_binding_sets
from evaluators.tasks.binding.jobs import binding_jobs
from evaluators.tasks.binding.rows import stacks
from evaluators.tasks.binding.task import SPLITS
from evaluators.fitting import FitResult, RowReader, TrainConfig, feature_stats, row_sets_per_stack
from evaluators.fitting import stack_scoring
from evaluators.fitting import stacked as stacked_stage
from evaluators.fitting.linear import linear_stage
from evaluators.fitting.stack import Stack, StepGraphs
from evaluators.runner.request import EvaluationRequest
from evaluators.runner.planning import Work
from evaluators.runner.run import run_evaluation
from tests.test_host_syncs import counted_reads

FAMILIES = ["linear", "quadratic", "dnn"]
#: Columns that differ between any two runs of the same request.
RUN = {"run_id", "created_at", "wall_time_s", "host", "package_versions", "command"}
CONFIG = TrainConfig(epochs=4, l2_path=(1e-1, 1e-2, 1e-3), l1_path=(1e-2,))


def _row_sets(task, n_sets: int, width: int = 24, nan_in: int | None = None) -> list[dict[str, RowReader]]:
    """Synthetic row sets on the task's scenes: set i reads the O code through a noise of its own
    scale, so each set's probes find a different amount of it."""
    out = []
    for i in range(n_sets):
        rng = np.random.default_rng(i)
        sets = {}
        for s in SPLITS:
            o = task.codes[s][1].astype(np.float32)
            mix = rng.normal(size=(o.shape[1], width)).astype(np.float32)
            z = o @ mix + (0.5 + i) * rng.normal(size=(len(o), width)).astype(np.float32)
            if nan_in == i and s == "train":
                z[3, 2] = np.nan
            sets[s] = RowReader(z)
        out.append(sets)
    return out


def _numbers(result) -> dict:
    """Every family's metrics, error, test bits per scene and each probe's validation bits and settings."""
    return {f: ({k: v for k, v in r.metrics.items() if not (isinstance(v, float) and math.isnan(v))}, r.error,
                {t: None if b is None else b.tolist() for t, b in r.scene_bits.items()},
                {t: (fit.val_bits, fit.setting, fit.l2_path, fit.l1_path) for t, fit in (r.fits or {}).items()})
            for f, r in result.items()}


@pytest.fixture(scope="module")
def task(balanced_small):
    return binding_task(Dataset(balanced_small))


@pytest.fixture(params=["alone", "stacked", "graphed"])
def gradient_stage(request, monkeypatch) -> str:
    """The gradient stage as this machine runs it (row set by row set), and as CUDA runs it (the row
    sets of a stack stepped as one, `evaluators.fitting.stacked`; "graphed": a row set that stops
    stays in its stack at a rate of 0, as where the step is a CUDA graph), here on the CPU."""
    if request.param != "alone":
        monkeypatch.setattr(stacked_stage, "STACKED_DEVICES", ("cuda", "cpu"))
    if request.param == "graphed":
        monkeypatch.setattr(stacked_stage, "GRAPHED_DEVICES", ("cuda", "cpu"))
    return request.param


def test_a_row_set_in_a_stack_gets_the_numbers_it_gets_alone(task, gradient_stage, one_torch_thread):
    """To the last bit on one thread (on several, a batched product may split its sums otherwise:
    the rounding of float32, as between thread counts)."""
    sets = _row_sets(task, 3)
    families = FAMILIES + ["quadratic-shared"]
    stacked = evaluate_binding_sets(sets, task, families, train=CONFIG, n_boot=50)
    for inputs, together in zip(sets, stacked):
        alone = evaluate_binding(inputs, task, families, train=CONFIG, n_boot=50)
        assert _numbers(together) == _numbers(alone)
    # the sets differ (the test would pass on copies otherwise), and the gradient stage trained
    assert stacked[0]["linear"].fits["O_paper"].val_bits != stacked[2]["linear"].fits["O_paper"].val_bits
    assert stacked[0]["dnn"].fits["O_paper"].val_bits != stacked[2]["dnn"].fits["O_paper"].val_bits
    assert any(fit.best_epoch > 0 for r in stacked for f in families for fit in r[f].fits.values())


@pytest.mark.parametrize("graphed", [False, True])
def test_the_stacked_path_reads_what_the_path_row_set_by_row_set_reads(task, graphed, monkeypatch, one_torch_thread):
    """Stacked (vmap'd forwards, AdamW by hand, each row set's best weights kept in one tensor per
    stack), a row set's test bits are the row-set-by-row-set path's to float32's rounding, for
    the jobs that trained and for those the guard or the linear stage settled."""
    sets = _row_sets(task, 3)
    families = FAMILIES + ["quadratic-shared"]
    plain = evaluate_binding_sets(sets, task, families, train=CONFIG, n_boot=50)
    monkeypatch.setattr(stacked_stage, "STACKED_DEVICES", ("cuda", "cpu"))
    if graphed:
        monkeypatch.setattr(stacked_stage, "GRAPHED_DEVICES", ("cuda", "cpu"))
    stacked = evaluate_binding_sets(sets, task, families, train=CONFIG, n_boot=50)
    trained = 0
    for one, other in zip(plain, stacked):
        for f in families:
            for t, bits in one[f].scene_bits.items():
                np.testing.assert_allclose(other[f].scene_bits[t], bits, rtol=0, atol=1e-4)
            trained += sum(fit.best_epoch > 0 for fit in other[f].fits.values())
    assert trained > 5


def test_an_attention_row_set_in_a_stack_gets_the_numbers_it_gets_alone(task, gradient_stage, one_torch_thread):
    """Spatial row sets (4 tokens each: set i's O code in token i % 4), under the attention probe,
    whose moving average of weights and frozen warm-started encoder are stacked too."""
    sets = []
    for i in range(2):
        rng = np.random.default_rng(i)
        one = {}
        for s in SPLITS:
            o = task.codes[s][1].astype(np.float32)
            z = rng.normal(size=(len(o), 4, 8)).astype(np.float32)
            z[:, i % 4] += o @ rng.normal(size=(o.shape[1], 8)).astype(np.float32)
            one[s] = RowReader(z)
        sets.append(one)
    config = replace(CONFIG, epochs=3)
    stacked = evaluate_binding_sets(sets, task, ["attention"], train=config, n_boot=50)
    for inputs, together in zip(sets, stacked):
        alone = evaluate_binding(inputs, task, ["attention"], train=config, n_boot=50)
        assert _numbers(together) == _numbers(alone)
    assert stacked[0]["attention"].fits["O_paper"].val_bits != stacked[1]["attention"].fits["O_paper"].val_bits
    assert any(fit.best_epoch > 0 for r in stacked for fit in r["attention"].fits.values())


def test_stacked_adamw_steps_as_torchs_adamw():
    """The stacked step applies torch's AdamW rule with a learning rate per row set: two row sets at
    different rates, five steps on the same gradients, against one `torch.optim.AdamW` each."""
    rng = torch.Generator().manual_seed(0)
    start = torch.randn(2, 3, 4, generator=rng)
    grads = [torch.randn(2, 3, 4, generator=rng) for _ in range(5)]
    lrs = torch.tensor([1e-2, 3e-3])
    stack = object.__new__(Stack)
    stack.params, stack.trained, stack.decay, stack.average = {"w": start.clone()}, ["w"], 0.1, None
    stack.steps = torch.zeros((), dtype=torch.float64)
    stack.moments = {"w": (torch.zeros_like(start), torch.zeros_like(start))}
    stack.rate_fields, stack.train_sum = [], torch.zeros(2)
    stack.set_rates(lrs.tolist())
    for g in grads:
        stack.params["w"].grad = g.clone()
        stack.step()
    for k in range(2):
        p = torch.nn.Parameter(start[k].clone())
        opt = torch.optim.AdamW([p], lr=float(lrs[k]), weight_decay=0.1)
        for g in grads:
            p.grad = g[k].clone()
            opt.step()
        torch.testing.assert_close(stack.params["w"][k], p.detach(), rtol=1e-6, atol=1e-7)


def test_a_stack_whose_step_raises_is_fitted_alone(task, monkeypatch, one_torch_thread):
    """A stacked step that raises (out of memory, say) loses no row: its row sets' jobs train alone,
    from where the stage started, and read what they read when fitted alone."""
    monkeypatch.setattr(stacked_stage, "STACKED_DEVICES", ("cuda", "cpu"))
    sets = _row_sets(task, 2)
    real = Stack.losses

    def losses(self, *args, **kwargs):
        if self.jobs[0].name == "dnn/O_paper":
            raise RuntimeError("CUDA out of memory")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Stack, "losses", losses)
    stacked = evaluate_binding_sets(sets, task, ["dnn"], train=CONFIG, n_boot=50)
    monkeypatch.setattr(stacked_stage, "STACKED_DEVICES", ())
    for inputs, together in zip(sets, stacked):
        assert together["dnn"].error is None
        alone = evaluate_binding(inputs, task, ["dnn"], train=CONFIG, n_boot=50)
        assert _numbers(together)["dnn"][3]["O_paper"] == _numbers(alone)["dnn"][3]["O_paper"]


def test_a_stack_whose_scoring_raises_is_scored_job_by_job(task, monkeypatch, one_torch_thread):
    """A stacked forward that raises while a split is scored (out of memory, say) loses no row: its
    jobs are scored one by one, and read (to float32's rounding) what the stacked forward reads."""
    monkeypatch.setattr(stacked_stage, "STACKED_DEVICES", ("cuda", "cpu"))
    sets = _row_sets(task, 2)
    whole = evaluate_binding_sets(sets, task, ["dnn"], train=CONFIG, n_boot=50)
    scoring, bits = stacked_stage.score_stacks, stack_scoring.stacked_bits
    failing: set[int] = set()

    def score_stacks(stacks, *args):
        failing.update(id(m[0][1].model) for m in stacks if m[0][1].name == "dnn/O_paper")
        try:
            return scoring(stacks, *args)
        finally:
            failing.clear()

    def fragile(template, *args):
        if id(template) in failing:
            raise RuntimeError("CUDA out of memory")
        return bits(template, *args)

    monkeypatch.setattr(stacked_stage, "score_stacks", score_stacks)
    monkeypatch.setattr(stack_scoring, "stacked_bits", fragile)
    split = evaluate_binding_sets(sets, task, ["dnn"], train=CONFIG, n_boot=50)
    for once, twice in zip(whole, split):
        assert twice["dnn"].error is None
        np.testing.assert_allclose(twice["dnn"].scene_bits["O_paper"], once["dnn"].scene_bits["O_paper"], rtol=1e-5)
        assert twice["dnn"].metrics["beta_star_paper"] == pytest.approx(once["dnn"].metrics["beta_star_paper"], abs=1e-5)


def test_a_row_set_whose_activations_hold_nan_fails_alone(task, one_torch_thread):
    sets = _row_sets(task, 3, nan_in=1)
    stacked = evaluate_binding_sets(sets, task, ["linear"], train=CONFIG, n_boot=50)
    assert "NaN" in stacked[1]["linear"].error
    for i in (0, 2):
        assert stacked[i]["linear"].error is None
        alone = evaluate_binding(sets[i], task, ["linear"], train=CONFIG, n_boot=50)
        assert _numbers(stacked[i]) == _numbers(alone)


@pytest.mark.slow
def test_the_linear_stage_reads_the_host_as_often_for_4_row_sets_as_for_1(task):
    """Reads of tensor values (`counted_reads`) while the linear stage fits every target of 1 and
    of 4 row sets: one stack, so the same count."""
    config = TrainConfig(epochs=0, l2_path=(1e-1, 1e-2, 1e-3), l1_path=(1e-2,))
    counts = []
    for n in (1, 4):
        sets = _row_sets(task, n)
        jobs = [binding_jobs("linear", 24, task) for _ in sets]
        for js, inputs in zip(jobs, sets):
            for j in js:
                j.model.set_standardization(*feature_stats(inputs["train"]))
        results = [{j.name: FitResult(j.name, n_bits=j.targets["train"].shape[1]) for j in js} for js in jobs]
        active = [{j.name: j for j in js} for js in jobs]
        with counted_reads() as count:
            linear_stage(jobs, sets, config, "cpu", results, active)
        assert all(r.error is None and r.l2_path for rs in results for r in rs.values())
        counts.append(count[0])
    assert counts[0] == counts[1], counts


def test_stacks_keep_the_order_of_the_work_and_split_at_the_budget():
    work = [Work(layer, tokens, seed, ["linear"]) for seed in (0, 1) for layer in (0, 6, 12)
            for tokens in ("cls", "mean")]
    chunks = stacks(work, 4)
    assert [len(c) for c in chunks] == [4, 2, 4, 2]
    assert all(len({w.seed for w in c}) == 1 for c in chunks) and [w for c in chunks for w in c] == work
    # a row set of 2,500 rows x 384 and 300 bits takes about 30 MB: a GiB holds 36, a byte still holds one
    assert row_sets_per_stack(2500, (384,), 300, "cpu", 1 << 30) == 36
    assert row_sets_per_stack(2500, (384,), 300, "cpu", 1) == 1


@pytest.mark.slow
def test_a_run_fitted_row_set_by_row_set_writes_the_rows_of_one_stack(balanced_small, tmp_path, one_torch_thread):
    """`stack_bytes` decides only how many row sets share a solve: a run whose stacks hold one row set
    each writes the rows of a run that fits them all at once."""
    train = TrainConfig(epochs=2, l2_path=(1e-1, 1e-2), l1_path=(1e-2,))
    rows = {}
    for name, budget in (("one", 1), ("all", 1 << 30)):
        request = EvaluationRequest(["pixels", "random:dinov2-small"], balanced_small, layers="0,last",
                                    probes=["linear", "dnn"], train=replace(train, stack_bytes=budget),
                                    results_dir=tmp_path / name, threads=1)
        table = pq.read_table(run_evaluation(request, progress=False)).to_pylist()
        rows[name] = {(r["backbone"], r["layer"], r["tokens"], r["probe"]): {k: v for k, v in r.items() if k not in RUN}
                      for r in table}
    assert rows["one"].keys() == rows["all"].keys()
    assert {(b, layer) for b, layer, _, _ in rows["all"]} == {("pixels", 0), ("random:dinov2-small", 0),
                                                             ("random:dinov2-small", 12)}
    for key, row in rows["all"].items():
        assert row == rows["one"][key], key


def test_a_graphed_stack_keeps_stopped_row_sets_without_moving_the_others(task, monkeypatch, one_torch_thread):
    """Where the step is a CUDA graph a stopped row set stays in its stack at a rate of 0: the row
    sets read what a stack that drops its stopped row sets reads, with row sets stopping apart."""
    monkeypatch.setattr(stacked_stage, "STACKED_DEVICES", ("cuda", "cpu"))
    sets = _row_sets(task, 3)
    config = replace(CONFIG, epochs=12)
    shrinking = evaluate_binding_sets(sets, task, ["dnn"], train=config, n_boot=50)
    monkeypatch.setattr(stacked_stage, "GRAPHED_DEVICES", ("cuda", "cpu"))
    kept = evaluate_binding_sets(sets, task, ["dnn"], train=config, n_boot=50)
    assert [_numbers(r) for r in kept] == [_numbers(r) for r in shrinking]
    epochs = [{t: len(fit.history) for t, fit in r["dnn"].fits.items()} for r in kept]
    assert epochs == [{t: len(fit.history) for t, fit in r["dnn"].fits.items()} for r in shrinking]
    assert len({n for mine in epochs for n in mine.values()}) > 1  # they stopped at different epochs


@pytest.mark.parametrize("budget, reads", [(None, 1), (1, None)])
def test_a_stacked_fit_reads_each_training_file_once_where_the_budget_holds_them(task, monkeypatch, budget, reads):
    """Where the row sets' training rows fit the budget, each row set's training file is read once
    (its stages read the copy in memory); where they do not, the stages read the file as before."""
    monkeypatch.setattr(stacked_stage, "STACKED_DEVICES", ("cuda", "cpu"))
    sets = _row_sets(task, 2)
    takes: list[int] = []
    for inputs in sets:
        reader, counter = inputs["train"], len(takes)
        takes.append(0)

        def take(idx, reader=reader, counter=counter, original=reader.take):  # noqa: ANN001
            takes[counter] += 1
            return original(idx)
        monkeypatch.setattr(reader, "take", take)
    evaluate_binding_sets(sets, task, ["quadratic"], train=replace(CONFIG, stack_bytes=budget), n_boot=20)
    if reads is None:
        assert min(takes) > 5, takes
    else:
        assert takes == [reads] * len(sets), takes


def test_a_stacks_batch_is_one_gather_of_the_same_rows():
    """`_TrainRows`: row sets of one shape held in one tensor give each stack's batch (all of them or
    a subset, as stacks shrink) as a gather per row set and a stack of them would; other shapes are
    held apart."""
    rng = np.random.default_rng(0)
    arrays = {i: rng.normal(size=(10, 3)).astype(np.float32) for i in (2, 5, 7)}
    index = torch.tensor([0, 3, 4, 9])
    held = stacked_stage._TrainRows(arrays, "cpu")
    for sets in [(2, 5, 7), (5, 7), (2, 7), (7,)]:
        want = torch.stack([torch.from_numpy(arrays[i])[index] for i in sets])
        assert torch.equal(held.batch(sets, index), want)
    assert held.block is not None
    mixed = stacked_stage._TrainRows({**arrays, 9: rng.normal(size=(10, 4)).astype(np.float32)}, "cpu")
    assert mixed.block is None and torch.equal(mixed.batch((2, 5), index), held.batch((2, 5), index))


def test_validation_reads_the_same_held_tensors_every_epoch(task, monkeypatch):
    """A graphed stack's validation pass is replayed from a graph per chunk (`StepGraphs.validation_bits`),
    which reads the memory its capture saw: with the split held on the device, each stack's chunk
    rows and indices must be the same tensors at every epoch (stacked once for the stage)."""
    monkeypatch.setattr(stacked_stage, "STACKED_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(stacked_stage, "GRAPHED_DEVICES", ("cuda", "cpu"))
    seen: dict[tuple, list] = {}  # the tensors themselves, kept alive: a new one cannot take an old one's memory
    chunk_bits = stack_scoring.chunk_bits

    def watched(s, x, idx, device, held):  # noqa: ANN001
        seen.setdefault((id(s), x.shape), []).append((x, idx))
        return chunk_bits(s, x, idx, device, held)
    monkeypatch.setattr(stack_scoring, "chunk_bits", watched)
    evaluate_binding_sets(_row_sets(task, 2), task, ["quadratic", "dnn"], train=CONFIG, n_boot=20)
    assert len(seen) >= 4 and all(len(passes) > 2 for passes in seen.values())  # epochs
    assert all(x is passes[0][0] and idx is passes[0][1] for passes in seen.values() for x, idx in passes)


def test_a_validation_chunk_is_replayed_into_the_tensor_its_first_pass_made(monkeypatch):
    """`validation_bits`: the first call runs eagerly and its output is the tensor later calls (warm-ups,
    then replays of the captured pass) write in place, one graph per chunk."""
    from evaluators.fitting import cuda_graphs

    monkeypatch.setattr(cuda_graphs.GraphedStep, "_on_side_stream", lambda self, step: step())
    monkeypatch.setattr(cuda_graphs.GraphedStep, "_capture", lambda self, step, on_fail: type("G", (), {
        "replay": staticmethod(step)})())
    stack = type("S", (), {"params": {"w": torch.zeros(1)}, "trained": ["w"]})()
    graphs = StepGraphs(stack)
    value = torch.tensor([1.0, 2.0])
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    outs = [graphs.validation_bits(0, lambda: value * k, value) for k in range(1, 5)]
    monkeypatch.undo()
    assert all(o is outs[0] for o in outs) and outs[0].tolist() == [4.0, 8.0]
    assert set(graphs.validation.graphs) == {0} and graphs.validation.warmed[0] == cuda_graphs.WARMUP


def test_the_best_weights_of_a_stage_load_in_one_copy_per_type(monkeypatch):
    """`load_states`: what `load_state_dict` of each module loads, in one multi-tensor copy per
    (device, type); a state that does not match its module is refused as `load_state_dict` refuses it."""
    from evaluators.fitting.gradient import load_states

    def model(seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
        m.register_buffer("count", torch.full((2,), seed, dtype=torch.long))
        return m
    targets, sources = [model(0), model(1)], [model(2), model(3)]
    calls: list = []
    copy = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda dst, src: calls.append(len(dst)) or copy(dst, src))
    load_states([(t, {k: v.clone() for k, v in s.state_dict().items()}) for t, s in zip(targets, sources)])
    assert sorted(calls) == [2, 8]  # the two modules' long buffers, their eight float tensors
    for t, s in zip(targets, sources):
        assert all(torch.equal(a, b) for a, b in zip(t.state_dict().values(), s.state_dict().values()))
    with pytest.raises(RuntimeError, match="size mismatch"):
        load_states([(targets[0], {**targets[0].state_dict(), "0.weight": torch.zeros(5, 3)})])


def test_the_row_sets_of_a_stack_share_what_their_task_holds(task, monkeypatch, one_torch_thread):
    """What a row set's linear problems, moment labels and held codes hold comes from the task, not
    its input: built once for the stack and sent to the device once (per row set, 26 row sets' copies
    were ~2,000 transfers and ~4,400 small kernels on a GPU), so 4 row sets, stacked as CUDA stacks
    them, make as many transfers in the linear stage, as many `ClassLabels` and as many `HeldCodes`
    as 1."""
    from evaluators.fitting import linear, moments, scoring

    monkeypatch.setattr(stacked_stage, "STACKED_DEVICES", ("cuda", "cpu"))
    config = replace(CONFIG, epochs=1)
    counts = []
    for n in (1, 4):
        sent, made = [0], {"labels": 0, "codes": 0}
        monkeypatch.setattr(linear, "to_device", lambda values, device, sent=sent: (
            sent.__setitem__(0, sent[0] + 1), torch.as_tensor(values).to(device))[1])
        for cls, name in ((moments.ClassLabels, "labels"), (scoring.HeldCodes, "codes")):
            monkeypatch.setattr(cls, "__init__", lambda self, *a, init=cls.__init__, name=name, made=made: (
                made.__setitem__(name, made[name] + 1), init(self, *a))[1])
        results = evaluate_binding_sets(_row_sets(task, n), task, ["quadratic"], train=config, n_boot=20)
        assert all(r.error is None for rs in results for r in rs.values())
        counts.append((sent[0], made["labels"], made["codes"]))
    assert counts[0] == counts[1] and min(counts[0]) > 0, counts
