"""The linear stage: a probe's linear part by full-batch L-BFGS along an L2 and then an L1
penalty path, the strength chosen on validation (`evaluators.fitting.fit_probes`, step 1)."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from evaluators.fitting.data import _LINEAR_CHUNK, FitResult, ProbeJob, RowReader, TrainConfig
from evaluators.fitting.scoring import _batch_bits, _fail, _score

#: Train rows the linear stage keeps in memory between L-BFGS passes (bytes); beyond it,
#: every pass re-reads the rows from the memory-mapped cache (resident memory stays flat).
_LINEAR_KEEP_BYTES = 256 * 2**20


def _linear_stage(jobs: Sequence[ProbeJob], inputs: dict[str, RowReader], config: TrainConfig, device: str,
                  results: dict[str, FitResult], active: dict[str, ProbeJob]) -> None:
    """Fit each linear problem's penalty path once (per `linear_key`) and give every job its chosen solution."""
    reader = inputs["train"]
    keep = reader.n * int(np.prod(reader.row_shape)) * 4 <= _LINEAR_KEEP_BYTES
    cached = [(idx, torch.from_numpy(rows).to(device)) for idx, rows in reader.chunks(_LINEAR_CHUNK)] if keep else None
    chunks = (lambda: cached) if keep else (lambda: ((i, torch.from_numpy(r).to(device))
                                                    for i, r in reader.chunks(_LINEAR_CHUNK)))
    solved: dict[str, tuple[dict[str, torch.Tensor], dict[str, Any], FitResult]] = {}
    for job in jobs:
        r = results[job.name]
        try:
            if job.linear_key is not None and job.linear_key in solved:
                state, setting, source = solved[job.linear_key]
                job.model.load_state_dict(state, strict=False)
                r.l2_path, r.l1_path = list(source.l2_path), list(source.l1_path)
                r.val_bits, r.val_scene_bits = source.val_bits, source.val_scene_bits
            else:
                state, setting = _penalty_path(job, chunks, reader.n, inputs["val"], config, device, r)
                if job.linear_key is not None:
                    solved[job.linear_key] = (state, setting, r)
            r.setting.update(setting)
            r.best_epoch, r.converged, r.history = 0, setting["lbfgs_converged"], [(math.nan, r.val_bits)]
        except Exception as e:  # noqa: BLE001 — a failing probe becomes an error row
            _fail(r, e, active, job.name)


def _penalty_path(job: ProbeJob, chunks: Callable[[], Iterable[tuple[np.ndarray, torch.Tensor]]], n: int,
                  val: RowReader, config: TrainConfig, device: str,
                  result: FitResult) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """L-BFGS on the job's linear parameters along `config.l2_path`, then `config.l1_path`;
    (chosen linear state, setting).

    One strength for all bits: choosing per bit (each bit's logit reads only its own rows of
    the linear parameters, so it could) overfits validation wherever a bit is free in few
    scenes — on a 1-bit task whose bit moves over 64 positions, oracle:features read β* −0.87.
    The L1 path starts from the best L2 solution; its bias keeps an L2 penalty of the same
    strength (a bias is not sparse, and L1 would pull a rarely free bit's bias to its noise)."""
    model = job.model
    params = model.linear_parameters()
    named = {n_: p for n_, p in model.named_parameters() if any(p is q for q in params)}
    bias_ids = _bias_ids(model)
    weights = [p for p in params if id(p) not in bias_ids]
    biases = [p for p in params if id(p) in bias_ids]
    model.train()
    best: tuple[float, dict[str, torch.Tensor], dict[str, Any], np.ndarray] | None = None

    def solve(kind: str, strength: float) -> None:
        nonlocal best
        opt = torch.optim.LBFGS(params, lr=1.0, max_iter=config.lbfgs_iter, history_size=20,
                                line_search_fn="strong_wolfe", tolerance_grad=1e-7, tolerance_change=1e-10)

        def closure() -> float:
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for idx, x in chunks():
                loss = _batch_bits(job, "train", idx, x, device, amp=False)[0].sum() * (math.log(2) / n)
                loss.backward()
                total += loss.item()
            # the bias too: it corrects an exact prior, and a bit free in few training scenes
            # fits its bias to their noise (val 1.6 bits vs the prior's 1.0 on a 1-bit task)
            ridge = 0.5 * strength * sum((p * p).sum() for p in (biases if kind == "l1" else params))
            lasso = strength * sum(((p * p + config.l1_eps**2).sqrt() - config.l1_eps).sum() for p in weights) \
                if kind == "l1" else 0.0
            penalty = ridge + lasso
            penalty.backward()
            return total + penalty.item()

        opt.step(closure)
        iters = opt.state[opt._params[0]]["n_iter"]
        scored = _score([job], val, "val", device, config.batch_size)[job.name]
        if isinstance(scored, Exception):
            raise scored
        v = float(scored[0].mean())
        if not math.isfinite(v):
            raise FloatingPointError(f"validation loss is {v} at {kind.upper()} {strength:g}")
        (result.l1_path if kind == "l1" else result.l2_path).append((strength, v))
        if best is None or v < best[0]:
            best = (v, {n_: p.detach().clone() for n_, p in named.items()},
                    {"penalty": kind, "strength": strength, "lbfgs_converged": iters < config.lbfgs_iter}, scored[0])

    for l2 in config.l2_path:
        solve("l2", l2)
    if best is not None and config.l1_path:
        model.load_state_dict(best[1], strict=False)
    for l1 in config.l1_path:
        solve("l1", l1)
    if best is None:
        raise ValueError("the linear stage needs at least one L2 or L1 strength")
    model.load_state_dict(best[1], strict=False)
    result.val_bits, result.val_scene_bits = best[0], best[3]
    return best[1], best[2]


def _bias_ids(model: torch.nn.Module) -> set[int]:
    """The probe's per-bit bias (its own or a wrapped probe's): the one linear parameter the
    gradient stage trains on, and the one the L1 path keeps under L2."""
    return {id(p) for name, p in model.named_parameters() if name in ("bias", "probe.bias")}
