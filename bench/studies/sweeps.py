"""Intervention sweeps in a study: an `[[evaluate]]` block's `interventions` table, checked, and
what it expands to.

    [evaluate.interventions]
    subspace = { kind = "binding", layer = 2, rank = 16, seed = 0 }  # seed optional (0)
    kinds = ["shuffle", "inject"]
    strengths = [0, 0.5, 1]
    controls = ["random", "feature"]  # optional: control subspaces of the same rank beside it

Per backbone of the block and dataset, each subspace (the named kind and each control) is fitted
once, at (backbone, layer, kind, rank, seed, dataset), into the study folder's `subspaces/`
(`subspace_name`): an intervened backbone binds only to the dataset its subspace was fitted on.
Each (subspace, kind, strength) becomes an intervened backbone (`intervene:...` spec) evaluated
beside the block's own backbones; a kind's identity strength (shuffle 0, inject 1, remove 0) is
the base network itself, which the block evaluates anyway, so it is left out.
`sweep_plan` says all of it without fitting anything; `fit_subspaces` fits what is missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from bench.core.intervention_specs import IDENTITY_STRENGTH, INTERVENTION_KINDS, SUBSPACE_KINDS, intervention_spec
from bench.studies.parsing import Checker

#: Where a study keeps the subspaces its sweeps fit, inside its folder.
SUBSPACES = "subspaces"


@dataclass(frozen=True)
class Interventions:
    """A checked `interventions` table."""

    kind: str  # the subspace swept (binding, or any of SUBSPACE_KINDS)
    layer: int
    rank: int
    seed: int
    kinds: tuple[str, ...]
    strengths: tuple[float, ...]
    controls: tuple[str, ...] = ()

    @property
    def subspace_kinds(self) -> tuple[str, ...]:
        return (self.kind, *(c for c in self.controls if c != self.kind))


@dataclass(frozen=True)
class SubspaceFit:
    """One subspace a sweep needs: fitted on `dataset` at `layer` of the backbone `spec`, kept at `path`."""

    backbone: str  # the block's name for it
    spec: str
    dataset: str
    layer: int
    kind: str
    rank: int
    seed: int
    path: Path


@dataclass(frozen=True)
class SweepPlan:
    """The subspaces to fit and the intervened backbones (name, spec) of one block on one dataset."""

    fits: tuple[SubspaceFit, ...]
    backbones: tuple[tuple[str, str], ...]


def check_interventions(raw: Any, key: str, check: Checker) -> Interventions:
    """The `interventions` table at `key`, checked whole (an unknown kind or subspace kind, a
    strength outside [0, 1], a bad layer or rank is one line naming its key)."""
    table = check.table(raw, key, {"subspace": dict, "kinds": list, "strengths": list, "controls": list},
                        required=("subspace", "kinds", "strengths"))
    sub = check.table(table["subspace"], f"{key}.subspace", {"kind": str, "layer": int, "rank": int, "seed": int},
                      required=("kind", "layer"))
    for where, names, allowed in ((f"{key}.subspace.kind", [sub["kind"]], SUBSPACE_KINDS),
                                  (f"{key}.controls", check.items(table.get("controls", []), f"{key}.controls", str),
                                   SUBSPACE_KINDS),
                                  (f"{key}.kinds", check.items(table["kinds"], f"{key}.kinds", str), INTERVENTION_KINDS)):
        for i, name in enumerate(names):
            if name not in allowed:
                at = where if where.endswith(".kind") else f"{where}[{i + 1}]"
                raise check.fail(at, f"unknown {name!r}; allowed: {', '.join(allowed)}")
    strengths = check.items(table["strengths"], f"{key}.strengths", (int, float))
    for i, s in enumerate(strengths):
        if not 0 <= s <= 1:
            raise check.fail(f"{key}.strengths[{i + 1}]", f"strength {s:g} outside [0, 1]")
    if sub["layer"] < 0:
        raise check.fail(f"{key}.subspace.layer", f"must be ≥ 0 (0 = embeddings), got {sub['layer']}")
    if sub.get("rank", 16) < 1:
        raise check.fail(f"{key}.subspace.rank", f"must be ≥ 1, got {sub['rank']}")
    if not table["kinds"] or not strengths:
        raise check.fail(key, "give at least one kind and one strength")
    return Interventions(sub["kind"], sub["layer"], sub.get("rank", 16), sub.get("seed", 0), tuple(table["kinds"]),
                         tuple(float(s) for s in strengths), tuple(table.get("controls", [])))


def block_sweep(raw: Any, backbones: Sequence[Any], datasets: Sequence[str], key: str,
                check: Checker) -> Interventions | None:
    """The `interventions` table of the block at `key` checked (None: it has none), and the names
    of the backbones it expands its `backbones` to (each a label: it names rows)."""
    if raw is None:
        return None
    sweep = check_interventions(raw, f"{key}.interventions", check)
    for name, _ in sweep_plan(sweep, backbones, datasets[0], Path(".")).backbones:
        check.label(name, f"{key}.interventions", "an intervened backbone's name")
    return sweep


def subspace_name(backbone: str, sweep: Interventions, kind: str, dataset: str) -> str:
    """The file a subspace is kept in: every part of its fitting key in its name (the subspace kind
    a `-kind-` token, which `leaderboards.ablation.subspace_kind` reads back)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", backbone).strip("-.") or "backbone"
    return f"{safe}-L{sweep.layer}-{kind}-r{sweep.rank}-s{sweep.seed}-{dataset}.npz"


def intervened_name(backbone: str, kind: str, strength: float, subspace: str) -> str:
    """The rows' name of `backbone` under `kind` at `strength` on a `subspace`-kind subspace, e.g.
    `zoo-conjunctions shuffle 0.5 (binding)` (a label: a spec's `:` and `/` become `-`)."""
    tail = f" {kind} {strength:g} ({subspace})"
    safe = re.sub(r"[^A-Za-z0-9._+()-]+", "-", backbone).strip("-. ") or "backbone"
    return safe[: 64 - len(tail)].rstrip("-. ") + tail


def sweep_plan(sweep: Interventions, backbones: Sequence[Any], dataset: str, folder: Path) -> SweepPlan:
    """What the sweep of `backbones` (a block's `BackboneEntry`s) on `dataset` does, with the study
    folder `folder`: the subspace files to fit and the intervened backbones, (`intervened_name`,
    the whole `intervene:` spec)."""
    fits, out = [], []
    for b in backbones:
        for sub in sweep.subspace_kinds:
            path = (folder / SUBSPACES / subspace_name(b.name, sweep, sub, dataset)).resolve()
            fits.append(SubspaceFit(b.name, b.spec, dataset, sweep.layer, sub, sweep.rank, sweep.seed, path))
            for kind in sweep.kinds:
                for s in sweep.strengths:
                    if s != IDENTITY_STRENGTH[kind]:
                        out.append((intervened_name(b.name, kind, s, sub),
                                    intervention_spec(kind, s, sweep.layer, str(path), b.spec, seed=sweep.seed)))
    return SweepPlan(tuple(fits), tuple(out))


def sweep_notes(blocks: Sequence[Any], folder: Path) -> list[str]:
    """A plan line per block that sweeps interventions: what its sweep adds after the block's own
    rows (the subspaces to fit, the intervened backbones), which the plan's row sets and estimate
    leave out (an intervened backbone's layers are known once its subspace is)."""
    out = []
    for block in blocks:
        if block.interventions is not None:
            plans = [sweep_plan(block.interventions, block.backbones, d, folder) for d in block.datasets]
            fits = sum(not f.path.is_file() for p in plans for f in p.fits)
            out.append(f"  {block.key} {block.task} then sweeps {sum(len(p.backbones) for p in plans)} intervened "
                       f"backbones ({fits} subspaces to fit); not in the row sets or the estimate above")
    return out


def fit_subspaces(plan: SweepPlan, dataset: Path, *, device: str = "auto", limit: int | None = None,
                  progress: bool = True, say: Callable[[str], None] | None = None) -> list[Path]:
    """Fit every subspace of `plan` not yet in its file, on the dataset folder `dataset`; returns
    the files written. A backbone's swept subspace is fitted first and its controls at its rank
    (the rank its energy cut kept, not the probe's): a control is "a subspace of the same rank".
    Files already there are read with numpy alone, so a rerun of a finished sweep imports no torch;
    one fitted on something else than the plan asks (the block's backbone name given another spec,
    the dataset regenerated under its name, another limit: none of them is in the file's name) is
    fitted again, and `say` says why."""
    from bench.core.dataset import Dataset
    from evaluators.interventions import load_subspace, save_subspace

    written = []
    ranks: dict[tuple[str, int], int] = {}  # (backbone, layer) -> the swept subspace's rank
    ds = Dataset(dataset)
    train_fingerprint = ds.fingerprint("train")
    for fit in plan.fits:
        swept = (fit.backbone, fit.layer) not in ranks
        rank = fit.rank if swept else ranks[(fit.backbone, fit.layer)]
        sub = load_subspace(fit.path) if fit.path.is_file() else None
        stale = sub is not None and stale_because(sub.metadata(), fit, rank, limit, train_fingerprint)
        if stale and say is not None:
            say(f"{fit.path.name} was fitted on {stale}: fitting it again")
        if sub is None or stale:
            if say is not None:
                say(f"fitting the {fit.kind} subspace of {fit.backbone} at layer {fit.layer} on {fit.dataset}")
            from evaluators.interventions.fit import fit_subspace  # model code: only when a file is missing

            sub = fit_subspace(fit.spec, ds, fit.layer, kind=fit.kind, rank=rank, seed=fit.seed, device=device,
                               limit=limit, progress=progress)
            fit.path.parent.mkdir(parents=True, exist_ok=True)
            save_subspace(sub, fit.path)
            written.append(fit.path)
        if swept:
            ranks[(fit.backbone, fit.layer)] = sub.rank
    return written


def stale_because(meta: dict[str, Any], fit: SubspaceFit, rank: int, limit: int | None,
                  train_fingerprint: str) -> str | None:
    """What a subspace file (its metadata) was fitted on that `fit` does not ask for, in words; None
    when it is the subspace `fit` asks for (at `rank`, on `limit` scenes of a train split of that
    fingerprint)."""
    settings = meta.get("settings", {})
    asked = {"backbone": (meta.get("backbone"), fit.spec), "layer": (meta.get("layer"), fit.layer),
             "kind": (meta.get("kind"), fit.kind), "seed": (settings.get("seed"), fit.seed),
             "rank": (settings.get("rank"), rank), "limit": (settings.get("limit"), limit),
             "train split": (str(meta.get("dataset_fingerprint"))[:16], train_fingerprint[:16])}
    off = [f"{name} {was} (now {now})" for name, (was, now) in asked.items() if was != now]
    return ", ".join(off) or None
