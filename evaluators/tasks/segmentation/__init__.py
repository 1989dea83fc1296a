"""Segmentation (issue 58; the IsSameObject paper's downstream readout, Li et al., NeurIPS 2025 §4.4): how
well do light linear heads on a layer's frozen patch tokens segment the scene, by class and by
instance? Patch level: every patch of the backbone's grid is labelled from the exact instance
masks (`evaluators.tasks.segmentation.labels`: the instance covering most of the patch, background
one region; its class the object's conjunction, background a class of its own).

Heads (`HEADS`), linear on tokens standardised by their training statistics, trained on train with
AdamW, the weights of the epoch with the lowest validation loss kept (early stopping), scored on
test (`evaluators.tasks.segmentation.heads`):
- `semantic`: each patch's class by cross-entropy (the dataset's conjunctions + background).
- `instance`: a softmax over K slots per patch; two patches of one image agree by the inner product
  of their slot distributions, trained by binary cross-entropy towards "same instance" over every
  pair of the image's patches (the four pair kinds weighted alike), so the loss does not depend on
  which slot an object takes; a patch's predicted instance is its most probable slot.

Metrics on test patches (`evaluators.tasks.segmentation.metrics`), each with a 95% percentile
bootstrap interval over test images (`_lo`/`_hi`), and on validation (`val_*`, point values, where
`--layer best` chooses a layer):
- `semantic_miou`: per class, IoU of its patches summed over the test images, averaged over the
  classes present in the test ground truth (a class absent from test is left out of the mean; a
  patch wrongly predicted as it still counts against its true class).
- `instance_miou`: per image, ground-truth regions (background one of them) matched one to one to
  the predicted segments by the largest total IoU (Hungarian, `scipy.optimize.linear_sum_assignment`),
  the mean IoU of its foreground instances with their match (0 unmatched); averaged over the test
  images that hold an object.
- `instance_ari`: the adjusted Rand index of the predicted segments against the instances over
  the image's foreground patches, averaged over those images.

On imported ADE20K the classes are those the importer keeps (its top 20 and "other"), so its
mIoU is not the 150-class mIoU papers report. Its `Task` record (`TASK`, registered by
bench/core/tasks.py under "segmentation") and its heads' registry are here, and nothing that
imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.core.registry import Registry
from bench.core.tasks import Metric, Task

if TYPE_CHECKING:
    from evaluators.runner.request import EvaluationRequest


@dataclass(frozen=True)
class SegmentationHead:
    """A segmentation head: its `note` for help texts (the heads are built by `heads.fit_head`)."""

    note: str = ""


#: The heads `--probes` names for this task (entry-point group `bindingbench.segmentation_heads`).
HEADS: Registry[SegmentationHead] = Registry("probe", group="bindingbench.segmentation_heads")
HEADS.register("semantic", SegmentationHead("per-patch class"))
HEADS.register("instance", SegmentationHead("K slots, permutation-invariant"))

#: The heads a request that names none trains, and the metrics each reports.
DEFAULT_HEADS = ("semantic", "instance")
HEAD_METRICS = {"semantic": ("semantic_miou",), "instance": ("instance_miou", "instance_ari")}

def request_fields(request: EvaluationRequest) -> dict[str, Any]:
    """The segmentation fields of a request's probe fingerprint (here, without torch: a run settles
    what it owes before it loads model code)."""
    return {"epochs": request.epochs}


#: This task's record (bench/core/tasks.py registers it under "segmentation").
TASK = Task(
    summary="per-patch segmentation heads",
    probes="evaluators.tasks.segmentation:HEADS",
    runner="evaluators.tasks.segmentation.run:run_segmentation",
    metric="semantic_miou",
    metrics=(Metric("semantic_miou", "semantic mIoU", "segmentation", "%"),
             Metric("instance_miou", "instance mIoU", "segmentation", "%"),
             Metric("instance_ari", "instance ARI", "segmentation", "%")),
    default_layers="last",
    default_probes=DEFAULT_HEADS,
    token_choices=("all",),  # it labels every patch
    fixed_tokens=True,
    request="evaluators.tasks.segmentation:request_fields",
    summary_columns=("backbone", "layer", "probe", "seed", "status", "semantic_miou", "semantic_miou_lo",
                     "semantic_miou_hi", "instance_miou", "instance_miou_lo", "instance_miou_hi", "instance_ari",
                     "instance_ari_lo", "instance_ari_hi", "best_epoch", "error"),
    short_metrics=(("semantic mIoU %", "semantic_miou"), ("instance mIoU %", "instance_miou"),
                   ("ARI %", "instance_ari")),
    short_keys=("backbone", "layer", "probe", "seed"),
    board_metrics=("semantic_miou", "instance_miou", "instance_ari"),
    compare_metrics=("semantic_miou", "instance_miou", "instance_ari"),
    paired=(("semantic_miou", "evaluators.tasks.segmentation.metrics:paired_semantic_miou"),),
    title="Segmentation",
)
