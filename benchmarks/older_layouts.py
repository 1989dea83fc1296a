"""The evaluator's entry points wherever a checkout keeps them, for the benchmarks that time two
checkouts side by side (`PYTHONPATH=OTHER_CHECKOUT python benchmarks/fit.py`, `benchmarks/probes.py
--costs-only`: their docstrings say which checkouts): the one place that knows the older layouts.
Each name is tried where the current layout keeps it first (evaluators/ grouped into rooms,
issue 57), then where older checkouts kept it.

- `binding_task`, `evaluate_binding`, `SPLITS`: in `evaluators.tasks.binding`; in
  `evaluators.binding` before the rooms, since it was split out of `evaluators.run`, which held
  them before that (the names stayed).
- `evaluate_binding_sets`, `row_sets_per_stack`: row sets fitted as one batched problem, as
  `bench evaluate` fits a backbone (issue 37); None on a checkout from before, which fits one row
  set after another.
- `extract_activations`: `evaluators.cache.extract`; `evaluators.extract` before the rooms, whose
  keyword for the tokens choices was `views` (called here as `token_choices`, as today).
- `ProbeJob`, `RowReader`, `TrainConfig`, `fit_probes`: `evaluators.fitting`; before the rooms
  also re-exported by `evaluators.training`, where checkouts from before `fitting/` keep them.
- `Probe`, `MadeProbe`, `BINDING_PROBES`: `evaluators.probes.{base,pooled,families}`; in
  `evaluators.probes` and `evaluators.families` before the rooms.
"""

from __future__ import annotations

try:
    from evaluators.tasks.binding.columns import evaluate_binding
    from evaluators.tasks.binding.task import SPLITS, binding_task
except ImportError:
    try:
        from evaluators.binding import binding_task, evaluate_binding
        from evaluators.binding.task import SPLITS
    except ImportError:
        from evaluators.run import SPLITS, binding_task, evaluate_binding
try:
    from evaluators.tasks.binding.columns import evaluate_binding_sets
    from evaluators.fitting import row_sets_per_stack
except ImportError:
    try:
        from evaluators.binding import evaluate_binding_sets
        from evaluators.fitting import row_sets_per_stack
    except ImportError:
        evaluate_binding_sets = row_sets_per_stack = None
try:
    from evaluators.cache.extract import extract_activations
except ImportError:
    from evaluators.extract import extract_activations as _extract_with_views

    def extract_activations(*args, token_choices, **kwargs):  # type: ignore[no-redef]
        """The older checkout's `extract_activations`, asked with today's keyword."""
        return _extract_with_views(*args, views=token_choices, **kwargs)
try:
    from evaluators.fitting import ProbeJob, RowReader, TrainConfig, fit_probes
except ImportError:
    from evaluators.training import ProbeJob, RowReader, TrainConfig, fit_probes
try:
    from evaluators.probes.base import Probe
    from evaluators.probes.families import BINDING_PROBES
    from evaluators.probes.pooled import MadeProbe
except ImportError:
    from evaluators.families import BINDING_PROBES
    from evaluators.probes import MadeProbe, Probe

__all__ = ["BINDING_PROBES", "MadeProbe", "Probe", "ProbeJob", "RowReader", "SPLITS", "TrainConfig", "binding_task",
           "evaluate_binding", "evaluate_binding_sets", "extract_activations", "fit_probes", "row_sets_per_stack"]
