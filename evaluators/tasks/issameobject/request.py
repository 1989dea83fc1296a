"""The IsSameObject task's request hooks, without torch (a run settles what it owes before it loads
model code): the fields behind its rows' probe fingerprints (`request_fields`) and the probes that
run at a layer (`layer_probes`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from evaluators.runner.request import EvaluationRequest

#: The baselines that read the attention of the block that reads a layer: none for the last hidden state.
ATTENTION_BASELINES = ("attention-qk",)


def request_fields(request: EvaluationRequest) -> dict[str, Any]:
    """The IsSameObject fields of a request's probe fingerprint."""
    return {"epochs": request.epochs, "exclude_background": request.exclude_background}


def read_by_a_block(layer: int, n_layers: int) -> bool:
    """Whether some block reads hidden state `layer` (every one but the last; pixels and oracles have none)."""
    return 0 <= layer < n_layers


def layer_probes(probes: Sequence[str], layer: int, n_layers: int) -> list[str]:
    """The probes that run at `layer`: the attention baselines only where a block reads it."""
    return [p for p in probes if p not in ATTENTION_BASELINES or read_by_a_block(layer, n_layers)]
