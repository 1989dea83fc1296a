"""Probes: the binding families, how a probe is built, and the parts they share
(docs/explanation/architecture.md §3).

Every probe models q(t | z) = Π_k q(t_k | t_<k, z) for a binary target t (the object
code O, the feature code F, or O given F) and is trained teacher-forced: the forward
pass takes the true code and returns all K conditional logits at once. Summed binary
cross-entropies are then exactly -log2 q(t | z), the code length the metrics need.

Families differ only in how a conditional reads z:
- `linear`: logit_k = w_k·z + u_k·t_<k.
- `quadratic`: adds a low-rank symmetric form x_kᵀ W_k x_k on x_k = [z, cond, t_<k],
  W_k = P_kᵀ diag(s_k) P_k.
- `quadratic-shared`: the quadratic term is bilinear in z with factors shared across
  conjunctions, W_k = U_{colour(k)}ᵀ V_{shape(k)}: a probe that can only read binding
  through colour x shape products (if it matches `quadratic`, binding is bilinear).
- `dnn`: ONE masked autoregressive network (MADE, Germain et al. 2015) computing all K
  conditionals in a single pass, plus an unmasked trunk on z that every head may read.
- `attention`: over spatial tokens; bit k's query comes from a learned bit embedding
  and t_<k, a softmax over tokens pools values, and a quadratic readout scores them.

Inputs are standardised with training-set statistics (set by the trainer), so the same
learning rate works for oracle codes and for backbone features with large norms.

A probe computes a *residual* on top of an exact prior logit that the trainer adds
(docs/explanation/architecture.md §3, prior-anchored probes): every term that reaches the output starts at zero
(`zero_residual`), so an untrained probe codes exactly the prior and a representation
that adds nothing leaves it there. Unanchored probes (the paper's estimator) use the
same modules with a prior of 0 (p = 1/2 per bit).

Where each part lives:
- `families`: the registries (`BINDING_PROBES`, `ISSAMEOBJECT_PROBES`, `TOKEN_CHOICES`) and their entries;
  free of torch, so help texts, validation and the leaderboard read the names cheaply (this
  package's `__init__` imports nothing for the same reason).
- `build`: how a probe is built from its entry (`build_probe`, `probe_optim`, `check_family`) and
  the wrappers that change what it reads (`BlindProbe`, `PlantedProbe`).
- `base`: what every binding probe shares (`Probe`, `anchor`, `scene_bits`).
- `pooled`: `linear`, `quadratic`, `quadratic-shared`, `dnn`; `attention`: the spatial family,
  over `token_encoder`'s per-token encoder.
- The IsSameObject pair probes are the task's own (`evaluators.tasks.issameobject.scorers`).
"""
