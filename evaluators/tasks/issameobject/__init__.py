"""IsSameObject (docs/explanation/architecture.md §3; Li et al., NeurIPS 2025): is "these two patches belong to the
same object" decodable from a layer's patch tokens?

Pairs. Patch labels come from the instance masks at the backbone's grid
(`evaluators.tasks.issameobject.patch_labels`); background is one region, so two background patches are a
"same" pair unless `exclude_background` drops background patches altogether. Pairs are
drawn per image, never across images, from distinct valid patches (i < j):
- `balanced` (default, used for train, val and test): a quarter of `pairs_per_image`
  from each pair kind — same object, background-background (both "same"), two
  different objects, object-background (both "different") — without replacement.
  Drawn uniformly instead, background pairs swamp both classes and a probe scores
  well by finding the background alone, never telling two objects apart. With
  `exclude_background` the two object kinds get half each. An image short of a kind
  contributes what it has, so the mix is near, not exactly, 50/50; the majority
  baseline reports the residual imbalance.
- `natural`: up to `pairs_per_image` pairs uniformly among all pairs of the image, so
  the classes keep their natural (mostly "same background") proportion.

Scorers, all symmetric in their two inputs by construction (score(x, y) = score(y, x)):
- probes trained with binary cross-entropy on standardised tokens, AdamW, early
  stopping on validation loss: `linear` σ(w·x + w·y + b); `diag-quadratic`
  σ(xᵀdiag(v)y + w·(x + y) + b); `quadratic` σ(xᵀWy + w·(x + y) + b),
  W = (UᵀV + VᵀU)/2 of rank r. The quadratic forms keep the linear term, so each
  family contains the one before it (as the binding probes do): without it a pure
  bilinear form cannot say "both patches are background" when background tokens are
  near zero (oracle:patches), and trains badly from a small start;
  `pointwise-identity` σ(a·⟨p(x), p(y)⟩ + b) with p a softmax over K instance slots
  (each patch names its object; two patches agree when their slot distributions do).
- bias-only baselines on the raw tokens, σ((s - μ_s)/σ_s + b) with only b learned (μ_s,
  σ_s the similarity's training mean and spread, so the sign is fixed and nothing but a
  threshold is fitted):
  `cosine`, `dot`, `distance` (s = -‖x - y‖), `attention-qk` (the attention logit of
  the block that reads the layer, symmetrised and averaged over heads:
  s = mean_h (q_h(n(x))·k_h(n(y)) + q_h(n(y))·k_h(n(x))) / 2 / sqrt(d_head), n that
  block's pre-attention norm, q and k its query/key projections with their biases;
  computed from the cached tokens and the backbone's weights, `Backbone.attention_qk`),
  and `majority` (the training majority class). `attention-qk` needs a backbone that
  exposes those projections (Hugging Face, timm and OpenCLIP ViTs whose logits depend on
  the two tokens alone, `random:` presets included); asking it of any other is an error.
  The last hidden state feeds no block, so there is no attention-qk row for it (a run
  says so in one line).

Metrics on test pairs: accuracy (threshold 0.5), balanced accuracy, AUROC (exact, ties
count one half), majority-baseline accuracy, each with a percentile bootstrap interval
over test *images* (pairs of one image are not independent). Accuracy, balanced accuracy
and AUROC are also measured on the validation pairs (`val_*` columns): a leaderboard's
`best` layer is chosen there, so the test number it reports is not the luckiest of several.

Correlation with attention (trained probes; backbones that expose query/key projections,
layers a block reads, i.e. not the last hidden state): `attention_r` is the Pearson r,
over test pairs, between the probe's scores and the attention weights of the block
that reads the layer, symmetrised and averaged over heads, (A_ij + A_ji) / 2 with
A_ij = mean_h softmax_j(q_h(n(x_i))·k_h(n(x_j)) / sqrt(d_head)). The softmax runs over
the tokens the cache holds for the image, its patch tokens: prefix tokens (CLS,
registers) are not cached, so A is the model's attention renormalised over the patches.
`attention_p` is a two-sided permutation p-value, (1 + #{|r_perm| ≥ |r|}) / (1 + n),
1000 seeded permutations of the pairs within their images. Both are null elsewhere.

The code is split by concern: `pairs` (sampling), `scorers` (probes, baselines, fitting),
`metrics`, `attention` (correlation with attention), `evaluate` (the orchestration) and `run`
(the task's runner). Its `Task` record (`TASK`, registered by bench/core/tasks.py under
"issameobject") is here, and nothing else: the registry reads it without importing torch
(`bench evaluate --help` lists the tasks).
"""

from __future__ import annotations

from bench.core.tasks import Metric, Task

#: The pair probes a request that names none evaluates.
DEFAULT_PROBES = ("linear", "diag-quadratic", "quadratic")

#: This task's record (bench/core/tasks.py registers it under "issameobject").
TASK = Task(
    summary="patch-pair probes",
    probes="evaluators.probes.families:ISSAMEOBJECT_PROBES",
    runner="evaluators.tasks.issameobject.run:run_issameobject",
    ray_runner="evaluators.runner.ray_executor:run_issameobject",
    metric="accuracy",
    metrics=(Metric("accuracy", "IsSameObject accuracy", "issameobject", "%"),
             Metric("balanced_accuracy", "balanced accuracy", "issameobject", "%"),
             Metric("auroc", "AUROC", "issameobject", "%")),
    default_layers="all",
    default_probes=DEFAULT_PROBES,
    token_choices=("all",),  # it compares patch tokens
    fixed_tokens=True,
    request="evaluators.tasks.issameobject.request:request_fields",
    check_backbone="evaluators.tasks.issameobject.evaluate:check_attention_qk",
    backbone_notes="evaluators.tasks.issameobject.evaluate:unread_layer_note",
    layer_probes="evaluators.tasks.issameobject.request:layer_probes",
    summary_columns=("backbone", "layer", "probe", "seed", "status", "accuracy", "accuracy_lo", "accuracy_hi",
                     "balanced_accuracy", "auroc", "majority_accuracy", "val_accuracy", "attention_r", "attention_p",
                     "error"),
    short_metrics=(("accuracy %", "accuracy"), ("balanced %", "balanced_accuracy"), ("AUROC %", "auroc"),
                   ("majority %", "majority_accuracy")),
    short_keys=("backbone", "layer", "probe", "seed"),
    board_metrics=("accuracy", "balanced_accuracy", "auroc"),
    title="IsSameObject",
    report_section="leaderboards.sections:issameobject_section",
)
