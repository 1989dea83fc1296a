"""IsSameObject evaluation: fit and score every probe at every layer of a backbone and write one
result row per (layer, probe, seed) (package docstring, `evaluators.tasks.issameobject`)."""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from bench.core.console import progress_bar
from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from bench.core.hashing import derive_seed
from bench.core.results import layer_row
from evaluators.backbones.base import AttentionQK
from evaluators.probes.families import ISSAMEOBJECT_PROBES, pair_probe_names
from evaluators.tasks.issameobject.attention import attention_correlation, pair_attention
from evaluators.tasks.issameobject.metrics import pair_metrics, validation_metrics
from evaluators.tasks.issameobject.pairs import PairConfig, Pairs, gather_tokens, sample_pairs
from evaluators.tasks.issameobject.patch_labels import split_patch_labels
from evaluators.tasks.issameobject.request import ATTENTION_BASELINES, layer_probes, read_by_a_block
from evaluators.tasks.issameobject.scorers import PairTrainConfig, fit_scorer
from evaluators.fitting import resolve_device
from evaluators.tasks.issameobject import DEFAULT_PROBES


def layer_data(tokens: np.ndarray, pairs: Pairs) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(U, ix, iy, same) of one split at one layer, the form `fit_scorer` takes."""
    u, ix, iy = gather_tokens(tokens, pairs)
    return u, ix, iy, pairs.same


def evaluate_layer(
    tokens: dict[str, np.ndarray],
    pairs: dict[str, Pairs],
    probes: Sequence[str],
    config: PairTrainConfig,
    n_boot: int = 1000,
    progress: Callable[[int], None] | None = None,
    qk: AttentionQK | None = None,
    attention_perms: int = 1000,
) -> list[dict[str, Any]]:
    """Fit and score every probe at one layer; one metrics dict per probe (errors kept as rows).

    `qk` is the block that reads this layer (for `attention-qk`; None gives an error row).
    With `qk`, every trained probe row also gets `attention_r`/`attention_p`: the Pearson
    correlation, over test pairs, of its scores with that block's attention weights
    (`attention_correlation`, `attention_perms` permutations); None without `qk`."""
    data = {s: layer_data(tokens[s], pairs[s]) for s in ("train", "val", "test")}
    u, ix, iy, same = data["test"]
    vu, vix, viy, vsame = data["val"]
    majority = bool(data["train"][3].mean() >= 0.5)
    attention: np.ndarray | None = None  # the test pairs' attention weights, computed once per layer
    non_finite = non_finite_tokens(data)
    out = []
    for name in probes:
        start = time.perf_counter()
        row: dict[str, Any] = {"probe": name, "n_train": len(pairs["train"]), "n_test": len(pairs["test"])}
        try:
            if non_finite and reads_tokens(name):
                raise FloatingPointError(non_finite)
            scorer = fit_scorer(name, data["train"], data["val"], config, qk=qk)
            scores = scorer.score(u[ix], u[iy])
            row.update(pair_metrics(scores, same, pairs["test"].image, majority, n_boot=n_boot, seed=config.seed))
            row.update(validation_metrics(scorer.score(vu[vix], vu[viy]), vsame, majority))
            if qk is not None and name in pair_probe_names(True):
                if attention is None:
                    attention = pair_attention(qk.copy_to(config.device), tokens["test"], pairs["test"])
                corr = attention_correlation(qk, tokens["test"], pairs["test"], scores, n_perm=attention_perms,
                                             seed=config.seed, attention=attention)
                row.update(attention_r=corr["r"], attention_p=corr["p"])
            row.update(status="ok", error=None, best_epoch=scorer.best_epoch)
        except (BenchError, FloatingPointError, RuntimeError) as e:
            row.update(status="error", error=f"{type(e).__name__}: {e}".splitlines()[0])
        row["wall_time_s"] = time.perf_counter() - start
        out.append(row)
        if progress:
            progress(1)
    return out


def non_finite_tokens(data: dict[str, tuple[np.ndarray, ...]]) -> str | None:
    """Why a layer's pair tokens (`layer_data` of every split) cannot be scored, or None: some hold
    NaN or inf. Said once for the layer's every probe that reads them, rather than left to fail
    inside a fit in whatever words it fails with (the baselines' bias fit said `Optimization bounds
    must be finite scalars`, and that escaped the layer, failing every layer of the backbone)."""
    bad = {s: int((~np.isfinite(u)).any(axis=1).sum()) for s, (u, *_rest) in data.items()}
    if not any(bad.values()):
        return None
    where = "; ".join(f"{s}: {n} of {len(data[s][0])}" for s, n in bad.items() if n)
    return f"the activations hold NaN or inf ({where} patch tokens)"


def reads_tokens(name: str) -> bool:
    """Whether probe `name` reads the activations (all but the majority class, which reads only labels)."""
    entry = ISSAMEOBJECT_PROBES.get(name)
    return entry.trained or entry.similarity is not None


def check_probes(probes: Sequence[str]) -> None:
    """Raise a one-line BenchError for the first name that is no IsSameObject probe."""
    ISSAMEOBJECT_PROBES.check(probes)


def check_attention_qk(backbone: Any, probes: Sequence[str]) -> None:
    """A one-line error, before any extraction, when `attention-qk` is asked of a backbone
    that exposes no query/key projections."""
    if "attention-qk" in probes and (not backbone.info.n_layers or backbone.attention_qk(0) is None):
        raise BenchError(f"probe: attention-qk needs a backbone that exposes its blocks' query/key projections "
                         f"(ViTs from Hugging Face, timm or OpenCLIP, not rotary-position ones); {backbone.info.spec} "
                         "has none")


def unread_layer_note(spec: str, backbone: Any, layers: Sequence[int], families: Sequence[str]) -> list[str]:
    """One line when a requested layer is the last hidden state, which no block reads: it gets no
    attention-qk row, and its trained probes no attention correlation."""
    n = backbone.info.n_layers
    if not n or n not in layers:
        return []
    baselines = [p for p in families if p in ATTENTION_BASELINES]
    correlated = any(p in pair_probe_names(True) for p in families) and backbone.attention_qk(0) is not None
    if baselines or correlated:
        what = " and ".join([*(f"no {p} row" for p in baselines), *(["no attention_r/attention_p"] if correlated else [])])
        return [f"note: {spec}: hidden state {n} (the last) feeds no block, so it gets {what}"]
    return []


def wants_qk(probes: Sequence[str], attention_corr: bool = True) -> bool:
    """The run needs the backbone's query/key projections (the model, not only its cached tokens)."""
    return "attention-qk" in probes or (attention_corr and any(p in pair_probe_names(True) for p in probes))


def pair_configs(device: str, epochs: int | None, exclude_background: bool, pair_config: PairConfig | None = None,
                 train_config: PairTrainConfig | None = None) -> tuple[PairConfig, PairTrainConfig]:
    """The pair sampling and probe training settings of a run, validated (every executor's)."""
    pc = pair_config or PairConfig()
    pc = replace(pc, exclude_background=exclude_background or pc.exclude_background)
    pc.validate()
    tc = replace(train_config or PairTrainConfig(), device=resolve_device(device))
    if epochs is not None:
        tc = replace(tc, epochs=epochs)
    return pc, tc


def evaluate_issameobject(
    spec: str | Any,
    dataset: Path | Dataset,
    *,
    layers: str | Sequence[int] = "all",
    probes: Sequence[str] = DEFAULT_PROBES,
    seeds: Sequence[int] = (0,),
    device: str = "auto",
    dtype: str = "fp32",
    epochs: int | None = None,
    exclude_background: bool = False,
    limit: int | None = None,
    progress: bool = True,
    pair_config: PairConfig | None = None,
    train_config: PairTrainConfig | None = None,
    n_boot: int = 1000,
    attention_corr: bool = True,
    attention_perms: int = 1000,
) -> list[dict[str, Any]]:
    """IsSameObject result rows (task "issameobject", tokens "all"): one per (layer, probe, seed).

    `spec` is a backbone spec or an already resolved Backbone. With `attention_corr`,
    trained probe rows of layers a block reads, on backbones exposing query/key
    projections, get `attention_r`/`attention_p` (`attention_correlation`).
    Activations of every split come from `evaluators.cache.extract.extract_activations` (one
    forward pass for all layers, cached). Provenance columns are left to the caller.
    """
    from evaluators.backbones import resolve_backbone
    from evaluators.cache.extract import extract_activations  # the extraction stage is only needed here

    check_probes(probes)
    want_qk = wants_qk(probes, attention_corr)
    if want_qk:  # needs the model's weights as well as its cached tokens
        spec = resolve_backbone(spec) if isinstance(spec, str) else spec
        check_attention_qk(spec, probes)
    ds = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
    pc, tc = pair_configs(device, epochs, exclude_background, pair_config, train_config)
    acts = {
        s: extract_activations(spec, ds, s, layers=layers, token_choices=("all",), device=device, dtype=dtype,
                               progress=progress, limit=limit)
        for s in ("train", "val", "test")
    }
    return evaluate_activations(
        acts, ds, probes=probes, seeds=seeds, pair_config=pc, train_config=tc, limit=limit, progress=progress,
        n_boot=n_boot, extra_config={"dtype": dtype},
        attention_qk=spec.attention_qk if want_qk else None, attention_perms=attention_perms,
    )


def evaluate_activations(
    acts: dict[str, Any],
    ds: Dataset,
    *,
    probes: Sequence[str] = DEFAULT_PROBES,
    seeds: Sequence[int] = (0,),
    pair_config: PairConfig = PairConfig(),
    train_config: PairTrainConfig = PairTrainConfig(),
    limit: int | None = None,
    progress: bool = True,
    n_boot: int = 1000,
    extra_config: dict[str, Any] | None = None,
    attention_qk: Callable[[int], AttentionQK | None] | None = None,
    attention_perms: int = 1000,
) -> list[dict[str, Any]]:
    """The rows of `evaluate_issameobject` from per-split `Activations` (anything with
    `.info`, `.layers`, `.grid` and `.get(layer, "all")`).

    `attention_qk` (layer -> the block that reads it, `Backbone.attention_qk`) is needed
    for the `attention-qk` baseline, which has no row at a layer no block reads (the last).
    Given, it also adds `attention_r`/`attention_p` to trained probe rows where a block
    reads the layer (`evaluate_layer`)."""
    check_probes(probes)
    if "attention-qk" in probes and attention_qk is None:
        raise BenchError("probe: attention-qk needs the backbone's query/key projections, not only its activations "
                         "(pass attention_qk=backbone.attention_qk)")
    test = acts["test"]
    if test.grid is None:
        raise BenchError(f"issameobject: backbone {test.info.spec!r} has no spatial tokens (it needs a patch grid)")
    labels = {s: split_patch_labels(ds, s, test.grid, pair_config.min_share, limit) for s in acts}
    info = test.info
    rows = []
    total = sum(len(layer_probes(probes, layer, info.n_layers)) for layer in test.layers) * len(seeds)
    with maybe_progress(progress, f"issameobject {info.spec}", total) as bar:
        for seed in seeds:
            pairs = {s: sample_pairs(labels[s], pair_config, pair_seed(seed, s)) for s in labels}
            config = replace(train_config, seed=int(seed))
            for layer in test.layers:
                here = layer_probes(probes, layer, info.n_layers)
                if not here:
                    continue
                tokens = {s: _limited(acts[s].get(layer, "all"), limit) for s in acts}
                qk = _reading_block(attention_qk, layer, info.n_layers, strict="attention-qk" in here)
                for r in evaluate_layer(tokens, pairs, here, config, n_boot, bar.advance if bar else None, qk=qk,
                                        attention_perms=attention_perms):
                    cfg = {
                        "task": "issameobject", "probe": r["probe"], "layer": int(layer), "seed": int(seed),
                        "pairs": asdict(pair_config), "train": {k: v for k, v in asdict(config).items() if k != "device"},
                        "limit": limit, **(extra_config or {}),
                    }
                    rows.append(layer_row(info, ds, task="issameobject", layer=layer, seed=seed, cfg=cfg, **r))
    return rows


def pair_seed(seed: int, split: str) -> int:
    """The seed of a split's pair draw for a row seed: the binding subspace is fitted on the very
    pairs the quadratic probe's rows are (`evaluators.interventions.fit`)."""
    return derive_seed(seed, "issameobject", split)


def _reading_block(attention_qk: Callable[[int], AttentionQK | None] | None, layer: int, n_layers: int,
                   strict: bool) -> AttentionQK | None:
    """The block that reads hidden state `layer`, or None (no block reads it, or no projections).
    Only the `attention-qk` baseline (`strict`) lets a failure to find them stop the run."""
    if attention_qk is None or not read_by_a_block(layer, n_layers):
        return None
    try:
        return attention_qk(layer)
    except BenchError:
        if strict:
            raise
        return None


def _limited(tokens: np.ndarray, limit: int | None) -> np.ndarray:
    return tokens if limit is None else tokens[:limit]


def maybe_progress(enabled: bool, description: str, total: int):
    """A progress bar (its handle has `advance`), or a context yielding None when disabled."""
    return progress_bar(description, total) if enabled else nullcontext(None)
