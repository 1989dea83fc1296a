"""The objective (docs/explanation/architecture.md §3): a zoo model's own training loss, measured on the
**val** split of the dataset given, with and without an intervention.

A zoo model publishes the head it was trained with (`evaluators.zoo.heads`); this task runs that
head on the model's last hidden state and reports the loss training computes
(`evaluators.zoo.training.head_loss`): the binary cross-entropy of the O code (`conjunctions`) or
the F code (`features`) read from CLS, or the squared error of the masked model's reconstruction of
its hidden patches (`masked`, masks drawn as training draws its validation masks: the same seed,
ratio and batches). The last hidden state comes from the backbone's own `hidden_states`, so a
backbone that wraps a zoo model (an intervened one, `base` its zoo model) is measured on its own
forward pass, hook and all; the masked model's hidden patches are greyed at the ViT's input.

One row per backbone: layer = the last hidden state (the head's input), probe "head", tokens
"all", split "val" (keyed like every row by the dataset's test fingerprint), `objective_loss`
(lower is better; nats per O or F value, or squared error per pixel) with a percentile bootstrap
interval over val scenes (`objective_loss_lo`/`_hi`; the masked loss is a ratio: squared error
summed over the drawn scenes' hidden patches over their count). The row's seed seeds the bootstrap
only. Each val scene's loss and element count (`scene_objective_loss`, `scene_objective_count`) come
with the row, so `bench compare` resamples two backbones' scenes together
(`evaluators.tasks.objective.pairing`). A backbone without a published head (a zoo folder trained before heads were published, a
hub model, pixels, oracles) is refused in one line, as is `zoo:untrained`, which has no objective.

Its `Task` record (`TASK`, registered by bench/core/tasks.py under "objective") and the registry
of its one "probe" (the model's own head) are here, and nothing else: no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bench.core.errors import BenchError
from bench.core.registry import Registry
from bench.core.tasks import Metric, Task

if TYPE_CHECKING:
    from evaluators.runner.request import EvaluationRequest

#: What reads the objective: the model's own head, the only choice (`--probes head`).
HEADS: Registry[str] = Registry("probe")
HEADS.register("head", "the zoo model's own training head")

def check_request(request: EvaluationRequest) -> None:
    """The head reads the last hidden state: no other layer has an objective (here, without torch:
    a run settles what it owes before it loads model code)."""
    if request.layers is not None and request.layers != "last":
        raise BenchError("layers: the objective task reads the last hidden state (its head's input); leave out "
                         "--layers")


#: This task's record (bench/core/tasks.py registers it under "objective").
TASK = Task(
    summary="a zoo model's own training loss on val",
    probes="evaluators.tasks.objective:HEADS",
    runner="evaluators.tasks.objective.run:run_objective",
    metric="objective_loss",
    metrics=(Metric("objective_loss", "objective loss", "objective", "loss", higher_is_better=False),),
    default_layers="last",
    default_probes=("head",),
    token_choices=("all",),  # the forward pass reads the whole image; the head reads CLS or the patches
    fixed_tokens=True,
    split="val",
    check="evaluators.tasks.objective:check_request",
    check_backbone="evaluators.tasks.objective.loss:check_head",
    summary_columns=("backbone", "layer", "probe", "seed", "status", "objective_loss", "objective_loss_lo",
                     "objective_loss_hi", "error"),
    short_metrics=(("loss", "objective_loss"),),
    short_keys=("backbone", "layer", "probe"),
    board_metrics=("objective_loss",),
    compare_metrics=("objective_loss",),
    paired=(("objective_loss", "evaluators.tasks.objective.pairing:paired_objective_loss"),),
    title="Objective",
)
