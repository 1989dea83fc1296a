"""The evaluator's entry points wherever a checkout keeps them, for the benchmarks that time two
checkouts side by side (`PYTHONPATH=OTHER_CHECKOUT python benchmarks/fit.py`: fit.py's docstring
says which checkouts): the one place that knows the older layouts.

- `binding_task`, `evaluate_binding`: in `evaluators.tasks.binding` since evaluators/ was grouped
  into rooms (issue 57); in `evaluators.binding` before, since it was split out of
  `evaluators.run`, which held them before that (the names stayed).
- `evaluate_binding_sets`, `row_sets_per_stack`: row sets fitted as one batched problem, as
  `bench evaluate` fits a backbone (issue 37); None on a checkout from before, which fits one row
  set after another.
"""

from __future__ import annotations

try:
    from evaluators.tasks.binding import binding_task, evaluate_binding
except ImportError:
    try:
        from evaluators.binding import binding_task, evaluate_binding
    except ImportError:
        from evaluators.run import binding_task, evaluate_binding
try:
    from evaluators.tasks.binding import evaluate_binding_sets
    from evaluators.fitting import row_sets_per_stack
except ImportError:
    try:
        from evaluators.binding import evaluate_binding_sets
        from evaluators.fitting import row_sets_per_stack
    except ImportError:
        evaluate_binding_sets = row_sets_per_stack = None

__all__ = ["binding_task", "evaluate_binding", "evaluate_binding_sets", "row_sets_per_stack"]
