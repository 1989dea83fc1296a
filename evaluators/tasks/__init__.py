"""The tasks `bench evaluate` measures, one package each, whose `__init__` keeps the task's record
(`TASK`, registered in `bench.core.tasks.TASKS`; planned by `evaluators.runner`, run by the task's
own `run`):

- `binding`: does a representation bind features to objects? Probes of the object code O given
  the feature code F, anchored on exact priors, and the estimator's metrics (β*, the paper's).
- `issameobject`: do two patches belong to the same object? Pair probes and training-free
  baselines on patch pairs, the patch labels they read, and the toy scenes' pairwise analysis.
"""
