"""What every binding probe on a dataset is trained and scored against: the codes, exact priors,
references, control and planted binding of a dataset (`binding_task`), after the checks that
refuse a dataset before any backbone loads."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow.parquet as pq

from bench.core.codes import FeatureSpace
from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from bench.core.hashing import derive_seed
from evaluators.tasks.binding.metrics import Priors
from generators.conditionals import bit_priors, effective_f_codes, resample_o
from generators.from_card import generator_of
from generators.importers.common import EMPIRICAL
from generators.priors import PriorsUnavailable

SPLITS = ("train", "val", "test")
#: The probes per family: the anchored F- and O|F-probes (headline), the paper's unanchored
#: direct O- and F-probes. Without exact priors F is unanchored already and serves both.
TARGETS = ("F", "O|F", "O_paper", "F_paper")
UNANCHORED_TARGETS = ("F", "O|F", "O_paper")
#: Real images: the O|F reference probe reads F alone (its input image is blanked).
EMPIRICAL_TARGETS = ("F", "O|F", "O|F_ref", "O_paper")
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
    #: The control this task is (one of its record's `Task.controls`), None for the real O.
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


def check_control(ds: Dataset, control: str | None, unanchored: bool) -> None:
    """Refuse a control on a dataset without exact priors: it draws O from the generator's p(O|F)."""
    if control is not None and (unanchored or ds.card.get("priors") == EMPIRICAL):
        raise BenchError(f"control: {control} draws O from the generator's exact p(O|F); {ds.path} has no exact "
                         "priors")


def check_dataset(ds: Dataset, options: Mapping[str, Any]) -> None:
    """A study's check of a dataset before any run (the task's `check_dataset`): its priors and the
    control asked for."""
    unanchored = options.get("unanchored", False)
    check_priors(ds, unanchored)
    check_control(ds, options.get("control"), unanchored)


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
    check_control(ds, control, unanchored)
    empirical = ds.card.get("priors") == EMPIRICAL
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
