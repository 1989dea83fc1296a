"""From fitted probes to a result row's columns: the binding metrics on test, the validation
numbers layers are chosen on, the planted binding's sensitivity and the row's config."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np

from bench.core.groups import group_labels, mean_se
from bench.core.hashing import config_hash
from evaluators.fitting import FitResult, ProbeJob, RowReader, TrainConfig, fit_row_sets
from evaluators.probes.families import family_defaults
from evaluators.probes.training import MACHINE_FIELDS
from evaluators.tasks.binding.jobs import binding_jobs
from evaluators.tasks.binding.metrics import TARGET_STATS, binding_metrics, row_checks
from evaluators.tasks.binding.task import BindingTask


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
    return evaluate_binding_sets([inputs], task, families, train=train, targets=targets, n_boot=n_boot,
                                 progress=progress)[0]


def evaluate_binding_sets(
    row_sets: Sequence[dict[str, RowReader]], task: BindingTask, families: Sequence[str], *,
    train: TrainConfig = TrainConfig(), targets: Sequence[str] | None = None, n_boot: int = 1000,
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, BindingResult]]:
    """`evaluate_binding` of several row sets (inputs of one width, a backbone's layers and
    views) fitted as one batched problem (`fit_row_sets`): each row set's results are those it
    gets alone.

    The probes of row sets of one width start the same (one seed): they are built once and
    copied (built for each of 26 row sets, their initialisation took ~0.8 s of an H200's fit)."""
    targets = tuple(task.targets if targets is None else targets)
    stacked = []
    built: dict[int, list[ProbeJob]] = {}
    for inputs in row_sets:
        in_dim = inputs["train"].row_shape[-1]
        if in_dim in built:
            jobs = [replace(j, model=copy.deepcopy(j.model)) for j in built[in_dim]]
        else:
            jobs = built[in_dim] = [j for family in families for j in binding_jobs(family, in_dim, task, train.seed,
                                                                                 targets)]
        stacked.append((jobs, inputs))
    fitted = fit_row_sets(stacked, train, progress, groups=task.codes["val"][0])
    return [_binding_results(fits, task, families, targets, train, n_boot) for fits in fitted]


def _binding_results(fits: dict[str, FitResult], task: BindingTask, families: Sequence[str], targets: tuple[str, ...],
                     train: TrainConfig, n_boot: int) -> dict[str, BindingResult]:
    """One row set's fitted probes as each family's metrics."""
    out = {}
    for family in families:
        mine = {t: fits[f"{family}/{t}"] for t in targets}
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
            out[family] = BindingResult(family, {}, bits, None, "; ".join(errors), mine)
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
        out[family] = BindingResult(family, metrics, bits, None if given_f is None else given_f.best_epoch, None, mine,
                                 ref_o_given_f)
    return out


def validation_columns(task: BindingTask, fits: dict[str, FitResult]) -> dict[str, float | None]:
    """The validation numbers a row keeps: each headline and paper probe's mean validation code
    length and its standard error over validation F codes, and the validation scenes' own prior
    references, from which `evaluators.tasks.binding.metrics.validation_metric` derives any metric on
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


#: What a row's config records of each probe's fit but its hash leaves out: the outcome of
#: training (best epoch, the settings chosen on validation, the guard), not the request.
_OUTCOME_KEYS = ("best_epochs", "chosen")


def result_columns(r: BindingResult, cfg: TrainConfig, wall: float, dtype: str, limit: int | None,
                    task: BindingTask) -> dict[str, Any]:
    fits = r.fits or {}
    # the memory a fit may take is the machine's, not the result's (`MACHINE_FIELDS`)
    train = {k: v for k, v in asdict(cfg).items() if k not in MACHINE_FIELDS}
    config = {"probe": r.family, "hparams": family_defaults(r.family), "train": train, "dtype": dtype,
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
