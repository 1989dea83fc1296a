"""The binding task's request hooks, without torch (a run settles what it owes before it loads
model code): its probe x tokens checks (`check_request`) and the training settings behind its
rows' probe fingerprints (`request_fields`)."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from evaluators.probes.families import check_family
from evaluators.probes.training import MACHINE_FIELDS, TrainConfig, resolve_device

if TYPE_CHECKING:
    from evaluators.runner.request import EvaluationRequest


def check_request(request: EvaluationRequest) -> None:
    """Every family asked for reads every tokens choice asked for (`check_family`: a spatial family
    needs `all`, a pooled one a pooled choice)."""
    for tokens in request.token_choices:
        for family in request.families:
            check_family(family, tokens)


def request_fields(request: EvaluationRequest) -> dict[str, Any]:
    """The binding fields of a request's probe fingerprint: the training settings asked for (device,
    seed and stack size aside: they do not change what is asked) and whether it is unanchored."""
    train = request.train or TrainConfig()
    if request.epochs is not None:
        train = replace(train, epochs=request.epochs)
    # a GPU trains the gradient stage under bf16 autocast (the families whose `ProbeFamily.amp`
    # says so) and in batches of its own size (`auto_batch_size`): its rows hold other numbers
    # than a CPU's, so they never share a key
    precision = {"precision": "cuda-family-amp", "batches": "cuda"} if resolve_device(request.device) == "cuda" else {}
    # nor does the memory a fit may take (`MACHINE_FIELDS`): its rows are the same
    return {"train": {k: v for k, v in asdict(train).items() if k not in ("seed", "device", *MACHINE_FIELDS)},
            "unanchored": request.unanchored, **precision}
