"""The evaluation orchestrator behind `bench evaluate` (and `bench demo`).

Two tasks share it. `binding` (the default): for each backbone, activations of the train/val/test splits (cached, docs/ARCHITECTURE.md §2), then
for every (layer, token view, seed) all requested probe families are trained together
from one pass over the data: per family an F-probe and an O-probe given F, both anchored
on the generator's exact priors (the headline chain-rule estimator), and the paper's
unanchored direct O- and F-probes (docs/ARCHITECTURE.md §3). Each (backbone, layer, view, probe, seed) becomes one results row
(docs/ARCHITECTURE.md §3). The run's file is rewritten atomically after every backbone, so an
interrupted run keeps what it finished; bad input stops the run with a BenchError.
`issameobject`: pairwise patch probes on every layer's spatial tokens
(`evaluators.issameobject`), one row per (backbone, layer, probe, seed), written the
same way.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Mapping, Sequence

import numpy as np
import pyarrow.parquet as pq
import torch

from bench.core.codes import FeatureSpace
from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from bench.core.hashing import config_hash, derive_seed
from bench.core.resources import disk_full
from bench.core.results import check_writable, existing_keys, new_run_id, provenance, write_run
from evaluators.backbones.base import BackboneInfo
from evaluators.backbones.ground_truth import GroundTruthBackbone
from evaluators.extract import (check_cache_space, check_views, extract_activations, gib, parse_layers, pending_bytes,
                                split_fingerprint)
from evaluators.families import family_defaults, pair_probe_names
from evaluators.issameobject import ATTENTION_BASELINES, check_attention_qk, evaluate_issameobject, layer_probes
from evaluators.metrics import TARGET_STATS, Priors, binding_metrics, group_labels, mean_se, row_checks
from evaluators.plan import EvaluationPlan, Model
from evaluators.probes import build_probe, conjunction_factors, conjunction_members
from evaluators.threads import chosen_threads
from evaluators.training import FitResult, ProbeJob, RowReader, TrainConfig, fit_probes, resolve_device
from generators.conditionals import PriorsUnavailable, bit_priors, effective_f_codes, generator_of, resample_o
from generators.importers.common import EMPIRICAL

SPLITS = ("train", "val", "test")
#: The probes per family: the anchored F- and O|F-probes (headline), the paper's unanchored
#: direct O- and F-probes. Without exact priors F is unanchored already and serves both.
TARGETS = ("F", "O|F", "O_paper", "F_paper")
UNANCHORED_TARGETS = ("F", "O|F", "O_paper")
#: Real images: the O|F reference probe reads F alone (its input image is blanked).
EMPIRICAL_TARGETS = ("F", "O|F", "O|F_ref", "O_paper")
#: Families whose other probes start from their O|F-probe's token encoder (`binding_jobs`).
WARM_STARTED = ("attention",)
#: Part of every probe fingerprint: raise it when a change to the probes, their training or the
#: metrics changes the numbers a request gives, so rows measured before are measured again.
PROBE_CODE_VERSION = 5
#: The planted binding behind every row's sensitivity: its share of scenes, and the seeds of its
#: O′ draws and of the scenes that carry it (fixed: every backbone meets the same plant).
PLANT_Q = 0.5
PLANT_SEED = 1
CONTROL_SEED = 0

Codes = dict[str, tuple[np.ndarray, np.ndarray]]  # split -> (F, O)


@dataclass
class BindingTask:
    """What every binding probe on a dataset is trained and scored against.

    `anchors` holds, per split, the exact prior logits of the F code and of O given F at
    every scene's own true prefix (±inf where the prior fixes a bit); None when the run
    is unanchored (`prior` "none"). `ref_F` / `ref_O_given_F` are the test scenes' own prior
    code lengths, -log2 P(f) and H(O|F=f), the references B_F and B* are measured from.
    """

    space: FeatureSpace
    codes: Codes
    priors: Priors
    anchors: dict[str, tuple[np.ndarray, np.ndarray]] | None
    ref_F: np.ndarray | None
    ref_O_given_F: np.ndarray
    n_F_eff: float | None
    #: Real images (an imported card, `priors: empirical`): no exact prior, so B* is measured
    #: against a reference O|F-probe of the same family that sees F but not the image, and
    #: ref_F is the test split's plug-in -log2 p̂(f).
    empirical: bool = False
    #: The validation scenes' own prior code lengths (as `ref_F`, `ref_O_given_F` for test):
    #: validation metrics, on which layers are chosen, are measured from them.
    val_ref_F: np.ndarray | None = None
    val_ref_O_given_F: np.ndarray | None = None
    #: The control this task is (`evaluators.plan.CONTROLS`), None for the real O.
    control: str | None = None
    #: The planted binding every family is also trained on, for its sensitivity (exact priors only).
    plant: "Plant | None" = None

    @property
    def prior(self) -> str:
        return "empirical" if self.empirical else "none" if self.anchors is None else "exact"

    @property
    def targets(self) -> tuple[str, ...]:
        if self.empirical:
            return EMPIRICAL_TARGETS
        if self.anchors is None:
            return UNANCHORED_TARGETS
        return TARGETS + (("O|F_planted",) if self.plant is not None else ())

    def first_train(self, n: int) -> "BindingTask":
        """The same task with only the first `n` training scenes (a smaller training set)."""
        cut = {"train": slice(0, n)}
        plant = self.plant and replace(self.plant, **{f: {s: a[cut.get(s, slice(None))] for s, a in
                                                          getattr(self.plant, f).items()}
                                                      for f in ("features", "codes", "anchors")})
        return replace(self, codes={**self.codes, "train": tuple(c[:n] for c in self.codes["train"])},
                       anchors=self.anchors and {**self.anchors, "train": tuple(a[:n] for a in self.anchors["train"])},
                       plant=plant)

    @property
    def paper_targets(self) -> tuple[str, ...]:
        """The probes behind the `*_paper` columns (unanchored, F serves as the paper's F-probe)."""
        return ("O_paper", "F") if self.anchors is None else ("O_paper", "F_paper")


@dataclass
class Plant:
    """A known binding planted in the backbone's own space: the probe of target "O|F_planted"
    reads [z, m·O′, m] (per token for spatial probes) and predicts O′, where O′ is each scene's
    O drawn afresh from the exact p(O | F) and m is 1 for a `PLANT_Q` share of scenes. O′ is
    independent of the image given F, so the representation's true β* for O′ is exactly the
    carrying scenes' share of Σ H(O|F=f) (`share`, on test), whatever z is: the β* a probe
    reads there, over `share`, is its sensitivity on this dataset at this size."""

    features: dict[str, np.ndarray]  # split -> N x (n_O + 1) float32: [m·O′, m]
    codes: dict[str, np.ndarray]  # split -> O′
    anchors: dict[str, np.ndarray]  # split -> prior logits of O′ given F
    share: float


def prior_logits(p: np.ndarray) -> np.ndarray:
    """log(p / (1 - p)) as float32, ±inf where the prior is certain (p = 1 or 0)."""
    with np.errstate(divide="ignore"):
        return (np.log(p) - np.log1p(-p)).astype(np.float32)


def open_dataset(path: Path, need_codes: bool = True) -> Dataset:
    """A dataset with non-empty train/val/test splits (and, for binding probes, F and O codes)."""
    try:
        ds = Dataset(path)
    except KeyError as e:  # the card lacks a field the reader needs (e.g. no feature space)
        raise BenchError(f"dataset: {path} has no {e.args[0]} in its card, so no F/O codes to probe") from None
    missing = [s for s in SPLITS if s not in ds.card["splits"] or ds.num_rows(s) == 0]
    if missing:
        raise BenchError(f"dataset: {path} lacks non-empty split(s) {', '.join(missing)}; probes need train, val and test")
    for split in SPLITS:  # the cheap check at open, of every split, before any backbone loads
        ds.files(split)
    if not need_codes:
        return ds
    columns = set(pq.read_schema(ds.files("test")[0]).names)
    if not {"F", "O"} <= columns:
        raise BenchError(f"dataset: {path} has no F/O code columns; binding probes need them")
    flat = [s for s in SPLITS if ds.card["splits"][s].get("H_O") == 0]
    if flat:  # β = (H(O) - L) / H(O) would be 0/0: refuse before any backbone loads
        fix = ("re-import with more scenes (a larger --max-scenes), another --top-n or larger --val-fraction/"
               "--test-fraction, so that every split holds several F codes" if ds.card.get("priors") == EMPIRICAL
               else "generate a dataset whose scenes vary")
        raise BenchError(f"dataset: {path} has H(O) = 0 in split(s) {', '.join(flat)} (every scene holds the same "
                         f"objects): there is no binding to measure; {fix}")
    return ds


def check_priors(ds: Dataset, unanchored: bool = False) -> float | None:
    """The effective number of test F codes when the card supports exact priors, None for an
    `unanchored` run; cheap, so bad input stops a run before any backbone is loaded.

    A card without what the priors need stops the run (exit 2) unless `unanchored`, which
    trains every probe from p = 1/2 and labels the rows `prior: none`. On a card that has
    exact priors `unanchored` is refused: every row carries the unanchored paper estimator.
    An imported card (`priors: empirical`) needs neither: see `empirical_priors`.
    """
    if ds.card.get("priors") == EMPIRICAL:
        return empirical_priors(ds, unanchored)
    try:
        generator_of(ds.card)
    except PriorsUnavailable:
        if unanchored:
            return None
        raise
    if unanchored:
        raise BenchError(f"unanchored: {ds.path} has exact priors, and every row already carries the unanchored "
                         "paper estimator (*_paper columns); drop --unanchored")
    return effective_f_codes(ds.card, "test")


def empirical_priors(ds: Dataset, unanchored: bool) -> float:
    """The plug-in n_F_eff of an imported (real-image) card's test split, after refusing what
    cannot be measured there: --unanchored (the rows are already prior-free) and a one-group
    coding (O = F, so there is nothing to bind)."""
    if unanchored:
        raise BenchError(f"unanchored: {ds.path} holds imported real images, measured against an empirical "
                         "reference probe already (prior: empirical); drop --unanchored")
    if len(ds.feature_space.sizes) < 2:
        raise BenchError(f"dataset: {ds.path} codes one feature group ({ds.feature_space.names[0]}), so O = F and "
                         "there is no binding to measure; use --task issameobject")
    return float(ds.split_info("test")["n_F_eff"])


def plugin_code_lengths(f: np.ndarray) -> np.ndarray:
    """-log2 p̂(f) per row, p̂ the rows' own F-code frequencies: mean = the plug-in H(F)."""
    _, inverse, counts = np.unique(f, axis=0, return_inverse=True, return_counts=True)
    return -np.log2(counts[inverse.reshape(-1)] / len(f))


def binding_task(ds: Dataset, limit: int | None = None, unanchored: bool = False, control: str | None = None,
                 plant: bool = True) -> BindingTask:
    """The codes, exact priors (unless `unanchored`, see `check_priors`) and test and validation
    references of a dataset's binding evaluation, on the first `limit` rows of every split.

    `control` "resampled-o" replaces every O by a draw from p(O | F) (exact priors only);
    `plant` adds the planted binding of `Plant` (exact priors only)."""
    n_eff = check_priors(ds, unanchored)
    empirical = ds.card.get("priors") == EMPIRICAL
    if control is not None and (empirical or unanchored):
        raise BenchError(f"control: {control} draws O from the generator's exact p(O|F); {ds.path} has no exact "
                         "priors")
    exact = not (empirical or unanchored)
    codes, anchors, refs, planted = {}, {}, {}, {}
    for split in SPLITS:
        f, o, h = ds.codes(split)
        f, o, h = f[:limit], o[:limit], h[:limit]
        keys = ds.table(split, ["scene_id"])["scene_id"].to_pylist()[:limit] if exact else []
        if control == "resampled-o":
            o = resample_o(ds.card, f, keys, seed=CONTROL_SEED)
        codes[split] = (f, o)
        if empirical:
            refs[split] = (plugin_code_lengths(f), h)
            continue
        if unanchored:  # no per-scene prior: validation uses the split's analytic H(F)
            refs[split] = (None if split == "test" else np.full(len(f), ds.split_info(split)["H_F"]), h)
            continue
        p_f, p_o = bit_priors(ds.card, split, f, o)
        anchors[split] = (prior_logits(p_f), prior_logits(p_o))
        with np.errstate(divide="ignore"):
            refs[split] = (-np.log2(np.where(f.astype(bool), p_f, 1.0 - p_f)).sum(axis=1), h)
        if plant:
            planted[split] = _plant_split(ds, split, f, keys)
    plant_data = None
    if plant and exact:
        m = planted["test"][0][:, -1]
        plant_data = Plant({s: p[0] for s, p in planted.items()}, {s: p[1] for s, p in planted.items()},
                           {s: p[2] for s, p in planted.items()},
                           float((m * refs["test"][1]).sum() / refs["test"][1].sum()))
    return BindingTask(ds.feature_space, codes, Priors.from_split_info(ds.split_info("test")),
                       anchors if exact else None, refs["test"][0], refs["test"][1], n_eff, empirical,
                       val_ref_F=refs["val"][0], val_ref_O_given_F=refs["val"][1], control=control, plant=plant_data)


def _plant_split(ds: Dataset, split: str, f: np.ndarray, keys: Sequence[str]) -> tuple[np.ndarray, ...]:
    """(features [m·O′, m], O′, prior logits of O′ given F) of one split's planted binding."""
    o_planted = resample_o(ds.card, f, keys, seed=PLANT_SEED)
    m = np.array([derive_seed("plant", PLANT_SEED, k) / 2.0**63 < PLANT_Q for k in keys], dtype=np.float32)
    features = np.concatenate([o_planted * m[:, None], m[:, None]], axis=1).astype(np.float32)
    return features, o_planted, prior_logits(bit_priors(ds.card, split, f, o_planted)[1])


def binding_jobs(family: str, in_dim: int, task: BindingTask, seed: int = 0,
                 targets: Sequence[str] | None = None) -> list[ProbeJob]:
    """The probes of one family, named `<family>/<target>`, each initialised from a seed
    derived from `seed` and its name. "F" and "O|F" are anchored on the exact priors (when
    the task has them: the O|F residual then reads Z alone, F being in its prior);
    "O_paper" and "F_paper" never are."""
    space = task.space
    factors = conjunction_factors(space.sizes)
    members = conjunction_members(space.sizes) if family == "attention" else None
    f_codes = {s: c[0] for s, c in task.codes.items()}
    o_codes = {s: c[1] for s, c in task.codes.items()}
    anchored = task.anchors or {}
    jobs = []
    targets_ = tuple(task.targets if targets is None else targets)
    for target in targets_:
        name = f"{family}/{target}"
        init = derive_seed("probe-init", seed, name)
        cond, prior = None, None
        if target == "F" and anchored:
            model = build_probe(family, in_dim, space.n_features, seed=init, anchored=True)
            codes, prior = f_codes, {s: a[0] for s, a in anchored.items()}
        elif target in ("F", "F_paper"):
            model, codes = build_probe(family, in_dim, space.n_features, seed=init), f_codes
        elif target == "O|F" and anchored:
            # F enters through the exact prior p(o_k | o_<k, f): the residual reads only Z
            model = build_probe(family, in_dim, space.n_conjunctions, factors=factors, members=members, seed=init,
                                anchored=True)
            codes, prior = o_codes, {s: a[1] for s, a in anchored.items()}
        elif target == "O|F":
            model = build_probe(family, in_dim, space.n_conjunctions, cond_dim=space.n_features, factors=factors,
                                members=members, seed=init)
            codes, cond = o_codes, f_codes
        elif target == "O|F_ref":
            model = build_probe(family, space.n_features, space.n_conjunctions, cond_dim=space.n_features,
                                factors=factors, members=members, seed=init)
            model, codes, cond = BlindProbe(model, f_codes["train"]), o_codes, f_codes
        elif target == "O_paper":
            model = build_probe(family, in_dim, space.n_conjunctions, factors=factors, members=members, seed=init)
            codes = o_codes
        elif target == "O|F_planted" and task.plant is not None:
            plant = task.plant
            model = build_probe(family, in_dim + plant.features["train"].shape[1], space.n_conjunctions,
                                factors=factors, members=members, seed=init, anchored=True)
            model, codes = PlantedProbe(model, plant.features["train"]), plant.codes
            cond, prior = plant.features, plant.anchors
        else:
            raise ValueError(f"unknown probe target {target!r}; allowed: {', '.join(TARGETS)}")
        # one target's probes share their linear stage across families; an attention probe's other
        # targets start from the token encoder its O|F-probe learned (an F-probe trained alone
        # on raw pixels read β_F 0.63, from the O|F-probe's encoder 0.96)
        warm = f"{family}/O|F" if family in WARM_STARTED and target != "O|F" and "O|F" in targets_ else None
        jobs.append(ProbeJob(name, model, codes, cond=cond, prior=prior, linear_key=target, warm_start=warm))
    return jobs


class BlindProbe(torch.nn.Module):
    """A probe that never sees the image: the F code stands in for Z, so it learns only what F
    and the earlier bits say about O. It is the empirical reference of real images, where no
    exact prior exists: B* = L^ref_O|F − L_O|F. F goes where Z would go (standardised, as Z
    is), not only through the conditioning path: a reference that read F only there trained
    slower than a probe handed F as Z, and oracle:features (whose Z is F) read B* ≈ 2.7 bits
    on a small VG import instead of 0. Given F as its Z, the reference is the image probe of
    a backbone that carries F and nothing else."""

    def __init__(self, probe: torch.nn.Module, f_train: np.ndarray) -> None:
        super().__init__()
        self.probe = probe
        self.lr, self.weight_decay, self.ema = probe.lr, probe.weight_decay, probe.ema
        f = np.asarray(f_train, dtype=np.float64)
        probe.set_standardization(f.mean(0), f.std(0))

    def set_standardization(self, mean: np.ndarray, std: np.ndarray) -> None:
        """The image's statistics do not apply: the input is F, standardised at construction."""

    def linear_parameters(self) -> list[torch.nn.Parameter]:
        return self.probe.linear_parameters()

    def nonlinear_parameters(self) -> list[torch.nn.Parameter]:
        return self.probe.nonlinear_parameters()

    @property
    def trains_context(self) -> bool:
        return self.probe.trains_context

    def linear_design(self, x: torch.Tensor, cond: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.probe.linear_design(cond.to(x.dtype), cond)

    def set_linear(self, *solution: torch.Tensor | None) -> None:
        self.probe.set_linear(*solution)

    def forward(self, x: torch.Tensor, target: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        z = cond.to(x.dtype)
        return self.probe(z.unsqueeze(1) if x.dim() == 3 else z, target, cond)  # one token for token probes


class PlantedProbe(torch.nn.Module):
    """A probe of `Plant`'s task: it reads z with the planted features [m·O′, m] appended (to
    every token of a spatial input), which reach it through the job's condition. The planted
    features are standardised with their own training statistics, z with z's."""

    def __init__(self, probe: torch.nn.Module, planted_train: np.ndarray) -> None:
        super().__init__()
        self.probe = probe
        self.lr, self.weight_decay, self.ema = probe.lr, probe.weight_decay, probe.ema
        self.planted_mean, self.planted_std = planted_train.mean(0), planted_train.std(0)

    def set_standardization(self, mean: np.ndarray, std: np.ndarray) -> None:
        self.probe.set_standardization(np.concatenate([mean, self.planted_mean]),
                                       np.concatenate([std, self.planted_std]))

    def linear_parameters(self) -> list[torch.nn.Parameter]:
        return self.probe.linear_parameters()

    def nonlinear_parameters(self) -> list[torch.nn.Parameter]:
        return self.probe.nonlinear_parameters()

    @property
    def trains_context(self) -> bool:
        return self.probe.trains_context

    def linear_design(self, x: torch.Tensor, cond: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.probe.linear_design(torch.cat([x, cond.to(x.dtype)], dim=-1), None)

    def set_linear(self, *solution: torch.Tensor | None) -> None:
        self.probe.set_linear(*solution)

    def forward(self, x: torch.Tensor, target: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        extra = cond.to(x.dtype)
        if x.dim() == 3:
            extra = extra[:, None, :].expand(-1, x.shape[1], -1)
        return self.probe(torch.cat([x, extra], dim=-1), target, None)


@dataclass
class BindingResult:
    """One family's outcome: metric columns, per-scene bits, best O-probe epoch, or an error."""

    family: str
    metrics: dict[str, float | None]
    scene_bits: dict[str, np.ndarray | None]
    best_epoch: int | None
    error: str | None = None
    fits: dict[str, FitResult] | None = None
    #: the test scenes' O|F references: H(O|F=f), or on real images the blind reference probe's bits
    ref_O_given_F: np.ndarray | None = None


def evaluate_binding(
    inputs: dict[str, RowReader], task: BindingTask, families: Sequence[str], *,
    train: TrainConfig = TrainConfig(), targets: Sequence[str] | None = None, n_boot: int = 1000,
    progress: Callable[[int], None] | None = None,
) -> dict[str, BindingResult]:
    """Train every family's probes on shared batches and compute the binding metrics on test.

    `targets` (default: all of the task's) lets a caller train a subset, e.g. only the
    anchored headline probes."""
    targets = tuple(task.targets if targets is None else targets)
    in_dim = inputs["train"].row_shape[-1]
    jobs = [j for fam in families for j in binding_jobs(fam, in_dim, task, train.seed, targets)]
    fits = fit_probes(jobs, inputs, train, progress, groups=task.codes["val"][0])
    out = {}
    for fam in families:
        mine = {t: fits[f"{fam}/{t}"] for t in targets}
        errors = [f"{t}-probe: {r.error}" for t, r in mine.items() if r.error]
        bits = {t: r.scene_bits for t, r in mine.items() if t != "O|F_planted"}
        # a probe the guard kept at its exact prior codes each test scene in exactly its prior code
        # length: the reference itself, not its float32 re-computation (β* is then 0.0, not 1e-8)
        for t, ref in (("F", task.ref_F), ("O|F", task.ref_O_given_F)):
            if t in mine and mine[t].guard == "prior" and ref is not None:
                bits[t] = np.asarray(ref, dtype=np.float64)
        if task.anchors is None and "F" in bits:
            bits["F_paper"] = bits["F"]  # unanchored: the F-probe is the paper's F-probe
        if errors:
            out[fam] = BindingResult(fam, {}, bits, None, "; ".join(errors), mine)
            continue
        given_f = mine.get("O|F")
        # real images: the blind reference probe's bits are the O|F reference (not a metric input)
        ref_o_given_f = bits.pop("O|F_ref", None) if task.empirical else task.ref_O_given_F
        metrics = binding_metrics(task.priors, bits, ref_F=task.ref_F, ref_O_given_F=ref_o_given_f,
                                  correct=None if given_f is None else given_f.bits_correct,
                                  n_bits=None if given_f is None else given_f.n_bits,
                                  n_boot=n_boot, seed=train.seed, groups=task.codes["test"][0])
        metrics.update(prior=task.prior, n_F_eff=task.n_F_eff,
                       converged=all(r.converged for t, r in mine.items() if t in ("F", "O|F", "O|F_ref")),
                       converged_paper=all(r.converged for t, r in mine.items() if t in task.paper_targets))
        metrics.update(validation_columns(task, mine))
        if "O|F_planted" in mine:
            metrics.update(sensitivity_columns(task, mine["O|F_planted"], n_boot, train.seed))
        out[fam] = BindingResult(fam, metrics, bits, None if given_f is None else given_f.best_epoch, None, mine,
                                 ref_o_given_f)
    return out


def validation_columns(task: BindingTask, fits: dict[str, FitResult]) -> dict[str, float | None]:
    """The validation numbers a row keeps: each headline and paper probe's mean validation code
    length and its standard error over validation F codes, and the validation scenes' own prior
    references, from which `evaluators.metrics.validation_metric` derives any metric on
    validation (layers are chosen there, never on test)."""
    groups = task.codes["val"][0]
    out: dict[str, float | None] = {}
    for target, stat in TARGET_STATS.items():
        fit = fits.get(target) or (fits.get("F") if target == "F_paper" and task.anchors is None else None)
        bits = None if fit is None else fit.val_scene_bits
        out[f"val_{stat}"] = None if bits is None else float(np.mean(bits))
        if target in ("F", "O|F"):
            out[f"val_{stat}_se"] = None if bits is None else mean_se(bits, groups)
    ref_o = task.val_ref_O_given_F
    if task.empirical and fits.get("O|F_ref") is not None:
        ref_o = fits["O|F_ref"].val_scene_bits
    out["val_H_F"] = None if task.val_ref_F is None else float(np.mean(task.val_ref_F))
    out["val_H_O_given_F"] = None if ref_o is None else float(np.mean(ref_o))
    return out


def sensitivity_columns(task: BindingTask, fit: FitResult, n_boot: int, seed: int) -> dict[str, float | None]:
    """The share of the planted binding (`Plant`) the family's probe recovers on test, with its
    interval: β* of the planted task over the share the plant truly carries."""
    if fit.error is not None or fit.scene_bits is None:
        return {"sensitivity": None, "sensitivity_lo": None, "sensitivity_hi": None}
    m = binding_metrics(task.priors, {"O|F": fit.scene_bits}, ref_O_given_F=task.ref_O_given_F, n_boot=n_boot,
                        seed=seed, groups=task.codes["test"][0])
    share = task.plant.share
    return {"sensitivity": m["beta_star"] / share, "sensitivity_lo": m["beta_star_lo"] / share,
            "sensitivity_hi": m["beta_star_hi"] / share}


def run_evaluation(plan: EvaluationPlan, *, progress: bool = True,
                   on_skipped: Callable[[int], None] | None = None) -> Path | None:
    """Evaluate the plan's backbones on its dataset; returns the results file written (None if
    nothing to do). The CLI, the Python API, `bench demo` and the Ray path all come here with
    an `EvaluationPlan`, so they compute the same rows.

    Every backbone is resolved and checked, and the activation cache's growth estimated against
    free disk, before any extraction; `on_skipped(n)` hears how many requested rows already
    exist (and are skipped). `progress` shows bars and notes on stderr.
    """
    if plan.executor != "local":
        from evaluators.ray_executor import check_options

        check_options(plan.executor, plan.task, plan.gpus_per_task, plan.address)
    ds = open_dataset(plan.dataset, need_codes=plan.task == "binding")
    check_writable(plan.results_dir)
    if plan.task == "issameobject":
        return _run_issameobject(plan, ds, progress, on_skipped)
    return _run_binding(plan, ds, progress, on_skipped)


def _run_binding(plan: EvaluationPlan, ds: Dataset, progress: bool,
                 on_skipped: Callable[[int], None] | None) -> Path | None:
    """Binding rows of every backbone of `plan`: in this process, or with executor "ray" as Ray tasks."""
    limit = _effective_limit(ds, plan.limit)
    base_train = replace(plan.train or TrainConfig(), device=resolve_device(plan.device))
    if plan.epochs is not None:
        base_train = replace(base_train, epochs=plan.epochs)
    check_priors(ds, plan.unanchored)
    if plan.control is not None and (plan.unanchored or ds.card.get("priors") == EMPIRICAL):
        raise BenchError(f"control: {plan.control} draws O from the generator's exact p(O|F); {plan.dataset} has no "
                         "exact priors")
    task_data: BindingTask | None = None  # built when the first row needs training
    test_fp, done, run_id, prov = _run_start(ds, limit, plan.results_dir, plan.overwrite, base_train.device,
                                             plan.command)
    request = {"train": {k: v for k, v in asdict(base_train).items() if k not in ("seed", "device")},
               "dtype": plan.dtype, "unanchored": plan.unanchored, **_preprocessing_request(plan)}
    plans = _backbone_plans(plan.models, ds, task="binding", layers=plan.layer_request, views=plan.views,
                            probes=plan.families, seeds=plan.seeds, done=done, test_fp=test_fp, limit=limit,
                            progress=progress, control=plan.control, preprocessing=plan.preprocessing,
                            probe_fps=probe_fingerprints("binding", plan.families, request))
    _check_cache(plans, ds, plan.dtype, limit, progress, on_skipped)
    if plan.executor == "ray":
        from evaluators.ray_executor import BindingSteps, run_binding

        return run_binding([p for p in plans if p.todo], ds, unanchored=plan.unanchored, prov=prov, test_fp=test_fp,
                           base_train=base_train, device=plan.device, dtype=plan.dtype, limit=limit,
                           results_dir=plan.results_dir, run_id=run_id, progress=progress, address=plan.address,
                           gpus_per_task=plan.gpus_per_task,
                           steps=BindingSteps(binding_task, binding_common, extraction_error_rows, binding_rows),
                           control=plan.control)
    with _local_threads(plan.threads, progress, plans):
        rows: list[dict[str, Any]] = []
        path = None
        for one in plans:
            if not one.todo:
                continue
            task_data = task_data or binding_task(ds, limit, plan.unanchored, plan.control)
            common = binding_common(prov, one, ds, test_fp, limit, task_data)
            try:
                acts = {s: extract_activations(one.backbone, ds, s, layers=one.layers, views=one.views,
                                               device=plan.device, dtype=plan.dtype, progress=progress, limit=limit)
                        for s in SPLITS}
            except BenchError:
                raise
            except Exception as e:  # noqa: BLE001 — a backbone that fails to run becomes error rows
                rows += one.stamp(extraction_error_rows(common, one, one.todo, e))
                path = write_run(rows, plan.results_dir, run_id)
                continue
            for layer, view, seed, fams in one.todo:
                rows += one.stamp(binding_rows(common, acts, task_data, layer, one.shown(view), seed, fams,
                                               replace(base_train, seed=seed), plan.dtype, limit, progress))
            path = write_run(rows, plan.results_dir, run_id)
    return path


def binding_common(prov: dict[str, Any], plan: _BackbonePlan, ds: Dataset, test_fp: str, limit: int | None,
                   task_data: BindingTask) -> dict[str, Any]:
    """The columns every binding row of one backbone shares."""
    return {**_common_columns(prov, plan, ds.name, test_fp, "binding", limit),
            "control": task_data.control,
            "n_train": len(task_data.codes["train"][1]), "n_test": len(task_data.codes["test"][1])}


def refuse_full_disk(error: BaseException, backbone: str) -> None:
    """A full disk is the machine's state, not the backbone's: end the run in one line rather than
    write error rows that would stand as the backbone's result. The rows written so far stay, and
    the rows extracted into the cache are resumed by the next run."""
    if disk_full(error):
        where = getattr(error, "filename", None) or "the activations cache"
        raise BenchError(f"disk full while extracting {backbone} ({where}): free space and run the same command "
                         "again; the rows written so far are kept") from None


def extraction_error_rows(common: dict[str, Any], plan: _BackbonePlan, todo: Sequence[tuple],
                          error: BaseException) -> list[dict[str, Any]]:
    """Error rows for every row of `todo` when the backbone failed to run (a full disk ends the
    run instead: `refuse_full_disk`)."""
    refuse_full_disk(error, common["backbone"])
    message = f"extraction failed: {type(error).__name__}: {error}".splitlines()[0]
    return [_row(common, layer, v, fam, seed, {"status": "error", "error": message})
            for layer, view, seed, fams in todo for v in plan.shown(view) for fam in fams]


def binding_rows(common: dict[str, Any], acts: dict[str, Any], task_data: BindingTask, layer: int,
                 shown: Sequence[str], seed: int, fams: Sequence[str], cfg: TrainConfig, dtype: str,
                 limit: int | None, progress: bool) -> list[dict[str, Any]]:
    """The rows of one (backbone, layer, view, seed): every family trained on one pass over the
    cached rows of view `shown[0]`, rows written under each of `shown`. A plain function so that
    a Ray task runs exactly what the local loop runs."""
    inputs = {s: RowReader(acts[s].get(layer, shown[0]), limit) for s in SPLITS}
    t0 = time.perf_counter()
    label = f"train {','.join(fams)} · {common['backbone']} layer {layer} {shown[0]} seed {seed}"
    with _epoch_bar(progress, label, cfg.epochs) as advance:
        results = evaluate_binding(inputs, task_data, fams, train=cfg, progress=advance)
    wall = (time.perf_counter() - t0) / len(fams)
    rows = []
    for fam in fams:
        columns = _result_columns(results[fam], cfg, wall, dtype, limit, task_data)
        rows += [_row(common, layer, v, fam, seed, columns) for v in shown]
    return rows


def _effective_limit(ds: Dataset, limit: int | None) -> int | None:
    """`limit`, or None when it cuts no split (a run on whole splits, whatever was asked)."""
    if limit is None or all(limit >= ds.num_rows(s) for s in SPLITS):
        return None
    return limit


@dataclass
class _BackbonePlan:
    """One backbone of an `EvaluationPlan`: resolved and checked before any backbone extracts
    anything, with the rows it still owes (`todo`). `aliases` maps a view to views that are the same vector
    on this backbone (on built-in backbones the class token is the mean patch token): their
    rows are copies of the view's, trained once."""

    spec: str
    backbone: Any
    layers: list[int]
    views: list[str]
    todo: list[tuple]
    skipped: int
    aliases: dict[str, list[str]]
    probe_fps: dict[str, str]
    name: str  # the `backbone` column: the display name of `-m NAME=SPEC`, else the spec

    def shown(self, view: str) -> list[str]:
        return [view, *self.aliases.get(view, [])]

    def stamp(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`rows` with the probe fingerprint of their probe (part of the key, as `_backbone_plans` keyed them)."""
        return [{**r, "probe_fingerprint": self.probe_fps[r["probe"]]} for r in rows]


def probe_fingerprints(task: str, probes: Sequence[str], request: dict[str, Any]) -> dict[str, str]:
    """Per probe family, a hash of its settings as requested (`request`: training, dtype, the
    task's options) with the family's defaults and `PROBE_CODE_VERSION`. The settings a
    validation sweep then picks are an outcome, not a request, so they stay out: a re-run
    of the same request is skipped, a changed request or probe code is measured again."""
    return {fam: config_hash({"task": task, "probe": fam, "hparams": family_defaults(fam) if task == "binding" else None,
                              "code": PROBE_CODE_VERSION, **request}) for fam in probes}


def _preprocessing_request(plan: EvaluationPlan) -> dict[str, Any]:
    """The input settings given in place of the models' own, for the request fingerprint (only
    when given, so rows measured with each model's own settings keep their fingerprint)."""
    if not plan.preprocessing:
        return {}
    return {"preprocessing": {k: list(v) if isinstance(v, tuple) else v for k, v in plan.preprocessing.items()}}


def _backbone_plans(models: Sequence[Model], ds: Dataset, *, task: str, layers: str | Sequence[int],
                    views: Sequence[str], probes: Sequence[str], seeds: Sequence[int], done: set[tuple], test_fp: str,
                    limit: int | None, progress: bool, probe_fps: dict[str, str],
                    control: str | None = None, preprocessing: Mapping[str, object] | None = None
                    ) -> list[_BackbonePlan]:
    """Resolve every backbone and check it against the task, views and probes, so that a bad
    combination fails in seconds instead of after another backbone's extraction and training.
    Notes are said once every backbone has passed, so a refusal is the only line a bad run prints."""
    plans, notes = [], []
    for model in models:
        name, spec = model.name, model.spec
        backbone = model.resolve(**(preprocessing or {})).bind(ds)
        if task == "issameobject":
            check_attention_qk(backbone, probes)
        check_views(backbone, ds, "test", views)
        try:
            layer_ids = parse_layers(layers, backbone.info.n_layers)
        except BenchError as e:  # name the backbone: a run may mix deep ones and layer-less references
            hint = "; it has no layers: evaluate it in a run without --layers" if not backbone.info.n_layers else ""
            raise BenchError(f"{e} (backbone {spec}{hint})") from None
        aliases: dict[str, list[str]] = {}
        if isinstance(backbone, GroundTruthBackbone) and {"cls", "mean"} <= set(views):
            aliases["cls"] = ["mean"]
            notes.append(f"{spec}: its class token is the mean patch token, so cls and mean are the same vector; "
                         "probes are trained once and the rows written under both")
        trained = [v for v in views if not any(v in a for a in aliases.values())]

        def key(layer: int, view: str, fam: str, seed: int) -> tuple:
            return (name, ds.name, test_fp, limit, control, "test", layer, view, task, fam, seed,
                    backbone.info.revision, probe_fps[fam])

        if task == "issameobject":
            notes += _unread_layer_note(spec, backbone, layer_ids, probes)
        todo, skipped = [], 0
        for layer in layer_ids:
            here = layer_probes(probes, layer, backbone.info.n_layers) if task == "issameobject" else probes
            for view in trained:
                for seed in seeds:
                    fams = [f for f in here if any(key(layer, v, f, seed) not in done for v in [view, *aliases.get(view, [])])]
                    skipped += len(here) - len(fams)
                    if fams:
                        todo.append((layer, view, seed, fams))
        plans.append(_BackbonePlan(spec, backbone, layer_ids, trained, todo, skipped, aliases, probe_fps, name))
    for note in notes:
        _say(progress, note)
    return plans


def _unread_layer_note(spec: str, backbone: Any, layers: Sequence[int], probes: Sequence[str]) -> list[str]:
    """One line when a requested layer is the last hidden state, which no block reads: it gets no
    attention-qk row, and its trained probes no attention correlation."""
    n = backbone.info.n_layers
    if not n or n not in layers:
        return []
    baselines = [p for p in probes if p in ATTENTION_BASELINES]
    correlated = any(p in pair_probe_names(True) for p in probes) and backbone.attention_qk(0) is not None
    if baselines or correlated:
        what = " and ".join([*(f"no {p} row" for p in baselines), *(["no attention_r/attention_p"] if correlated else [])])
        return [f"note: {spec}: hidden state {n} (the last) feeds no block, so it gets {what}"]
    return []


def _check_cache(plans: Sequence[_BackbonePlan], ds: Dataset, dtype: str, limit: int | None, progress: bool,
                 on_skipped: Callable[[int], None] | None) -> None:
    """Before any work: report rows already done, estimate how much the activation cache will
    grow and refuse a run the disk cannot hold (warning when all tokens of all layers are kept)."""
    skipped = sum(p.skipped for p in plans)
    if skipped and on_skipped is not None:
        on_skipped(skipped)
    needed = 0
    for p in plans:
        if not p.todo:
            continue
        size = sum(pending_bytes(p.backbone, ds, s, layers=p.layers, views=p.views, dtype=dtype, limit=limit)
                   for s in SPLITS)
        if "all" in p.views and len(p.layers) > 1 and size:
            _say(progress, f"warning: --tokens all over {len(p.layers)} layers of {p.spec} stores every patch token "
                           f"of every layer: ~{gib(size)} of activations cache")
        needed += size
    check_cache_space(needed, say=lambda text: _say(progress, text))


def _say(enabled: bool, text: str) -> None:
    """One line on stderr beside the progress bars (nothing when progress is off)."""
    if enabled:
        from bench.core.console import stderr

        stderr.print(text, soft_wrap=True, markup=False, highlight=False)


def _run_issameobject(plan: EvaluationPlan, ds: Dataset, progress: bool,
                      on_skipped: Callable[[int], None] | None) -> Path | None:
    """IsSameObject rows of every backbone, with the same provenance, keys and crash safety as binding
    rows; with executor "ray", every backbone's rows are computed by Ray tasks first."""
    task, probes, seeds, exclude_background = "issameobject", plan.families, plan.seeds, plan.exclude_background
    device, dtype, epochs, results_dir = plan.device, plan.dtype, plan.epochs, plan.results_dir
    limit = _effective_limit(ds, plan.limit)
    test_fp, done, run_id, prov = _run_start(ds, limit, results_dir, plan.overwrite, resolve_device(device),
                                             plan.command)
    request = {"epochs": epochs, "dtype": dtype, "exclude_background": exclude_background,
               **_preprocessing_request(plan)}
    plans = _backbone_plans(plan.models, ds, task=task, layers=plan.layer_request, views=["all"], probes=probes,
                            seeds=seeds, done=done, test_fp=test_fp, limit=limit, progress=progress,
                            preprocessing=plan.preprocessing,
                            probe_fps=probe_fingerprints(task, probes, request))
    _check_cache(plans, ds, dtype, limit, progress, on_skipped)
    if ds.card.get("generator", {}).get("name") == "colorshape" and any(p.todo for p in plans):
        _say(progress, "note: on ColorShape, IsSameObject is nearly trivial (flat colours: raw pixels read about "
                       "96% against a 57% majority); compare backbones with pixels, not with the majority")

    def work(one: _BackbonePlan) -> tuple[list[int], list[str]]:  # the layers and probes it still owes
        return (sorted({layer for layer, _, _, _ in one.todo}),
                [p for p in probes if any(p in fams for _, _, _, fams in one.todo)])

    computed: dict[str, Any] = {}
    if plan.executor == "ray":
        from evaluators.ray_executor import run_issameobject

        computed = run_issameobject([(p, *work(p)) for p in plans if p.todo], ds, seeds=seeds, device=device,
                                    dtype=dtype, epochs=epochs, exclude_background=exclude_background, limit=limit,
                                    results_dir=results_dir, run_id=run_id, progress=progress, address=plan.address,
                                    gpus_per_task=plan.gpus_per_task)
    with _local_threads(plan.threads, progress, plans, local=plan.executor != "ray"):
        rows: list[dict[str, Any]] = []
        path = None
        for one in plans:
            spec = one.spec
            todo = {(layer, fam, seed) for layer, _, seed, fams in one.todo for fam in fams}
            if not todo:
                continue
            common = {**_common_columns(prov, one, ds.name, test_fp, task, limit), "tokens": "all"}
            try:
                if spec in computed:
                    if isinstance(computed[spec], BaseException):
                        raise computed[spec]
                    new = computed[spec]
                else:
                    layer_ids, fams = work(one)
                    new = evaluate_issameobject(one.backbone, ds, layers=layer_ids, probes=fams, seeds=seeds,
                                                device=device, dtype=dtype, epochs=epochs,
                                                exclude_background=exclude_background, limit=limit, progress=progress)
            except BenchError:
                raise
            except Exception as e:  # noqa: BLE001 — a backbone that fails to run becomes error rows
                refuse_full_disk(e, spec)
                message = f"extraction failed: {type(e).__name__}: {e}".splitlines()[0]
                new = [{"layer": layer, "probe": fam, "seed": seed, "status": "error", "error": message}
                       for layer, fam, seed in sorted(todo, key=str)]
            mine = one.stamp([{**r, **common} for r in new
                               if (r["layer"], r["probe"], r["seed"]) in todo])
            if any(r["status"] == "ok" and r.get("auroc") is None for r in mine):
                _say(progress, f"warning: {spec}: some test pair sets hold one class only (all 'same' or all 'different'"
                               f"{'; --exclude-background drops every background pair' if exclude_background else ''}), "
                               "so their balanced accuracy and AUROC are blank")
            rows += mine
            path = write_run(rows, results_dir, run_id)
    return path


def _local_threads(threads: int | None, progress: bool, plans: Sequence[_BackbonePlan],
                   local: bool = True) -> ContextManager[Any]:
    """The torch threads of the in-process work: `threads`, or the default `evaluators.threads`
    picks (None), chosen once the run has work and said once; Ray tasks pin their own (one)."""
    if not local or not any(p.todo for p in plans):
        return nullcontext()
    return chosen_threads(threads, say=lambda text: _say(progress, text))


def _run_start(ds: Dataset, limit: int | None, results_dir: Path, overwrite: bool, device: str,
               command: str | None = None) -> tuple[str, set[tuple], str, dict[str, Any]]:
    """What every run starts from: the evaluated test fingerprint, the keys of rows already
    finished (none when overwriting), a new run id and its provenance columns."""
    done = set() if overwrite else existing_keys(results_dir)
    run_id = new_run_id()
    return split_fingerprint(ds, "test", limit), done, run_id, provenance(run_id, device, command)


def _common_columns(prov: dict[str, Any], plan: _BackbonePlan, dataset: str, test_fp: str, task: str,
                   limit: int | None) -> dict[str, Any]:
    """The columns every row of one backbone shares: provenance, backbone, dataset, task, limit."""
    info: BackboneInfo = plan.backbone.info
    return {**prov, "backbone": plan.name, "spec": plan.spec, "backbone_family": info.family,
            "backbone_revision": info.revision,
            "weights_fingerprint": info.revision,
            "dataset": dataset, "dataset_fingerprint": test_fp, "limit": limit, "split": "test",
            "n_layers": info.n_layers, "task": task}


def _row(common: dict[str, Any], layer: int, view: str, fam: str, seed: int, extra: dict[str, Any]) -> dict[str, Any]:
    return {**common, "layer": layer, "tokens": view, "probe": fam, "seed": seed, **extra}


#: What a row's config records of each probe's fit but its hash leaves out: the outcome of
#: training (best epoch, the settings chosen on validation, the guard), not the request.
_OUTCOME_KEYS = ("best_epochs", "chosen")


def _result_columns(r: BindingResult, cfg: TrainConfig, wall: float, dtype: str, limit: int | None,
                    task: BindingTask) -> dict[str, Any]:
    fits = r.fits or {}
    config = {"probe": r.family, "hparams": family_defaults(r.family), "train": asdict(cfg), "dtype": dtype,
              "resolution": "native", "limit": limit, "control": task.control,
              "best_epochs": {t: f.best_epoch for t, f in fits.items()},
              "chosen": {t: {**f.setting, "guard": f.guard, "val_saving_se": f.val_saving_se}
                         for t, f in fits.items()}}
    cols: dict[str, Any] = {"config": json.dumps(config, sort_keys=True, default=float),
                            "config_hash": config_hash({k: v for k, v in config.items() if k not in _OUTCOME_KEYS}),
                            "wall_time_s": wall, "best_epoch": r.best_epoch}
    if r.error:
        return {**cols, "status": "error", "error": r.error}
    per_scene = {"scene_bits_F": r.scene_bits.get("F"), "scene_bits_O_given_F": r.scene_bits.get("O|F"),
                 "scene_bits_O_paper": r.scene_bits.get("O_paper"), "scene_bits_F_paper": r.scene_bits.get("F_paper"),
                 "scene_ref_F": task.ref_F, "scene_ref_O_given_F": r.ref_O_given_F}
    return {**cols, **r.metrics, "status": "ok", "error": None, "checks": row_checks(r.metrics),
            "scene_groups": group_labels(task.codes["test"][0], len(task.codes["test"][0])).astype(np.int32).tolist(),
            **{k: (None if v is None else np.asarray(v, dtype=np.float32).tolist()) for k, v in per_scene.items()}}


@contextmanager
def _epoch_bar(enabled: bool, label: str, total: int) -> Iterator[Callable[[int], None] | None]:
    """A per-stage progress bar over epochs (nothing when progress is off)."""
    if not enabled:
        yield None
        return
    from bench.core.console import progress_bar

    with progress_bar(label, total) as bar:
        yield bar.advance
