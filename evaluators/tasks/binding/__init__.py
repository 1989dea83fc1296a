"""The binding task: what probes are trained against (`task`), the probes of a family (`jobs`),
scores to result columns (`columns`) and the rows of a run (`rows`)."""

from evaluators.tasks.binding.columns import evaluate_binding, evaluate_binding_sets
from evaluators.tasks.binding.task import binding_task

__all__ = ["binding_task", "evaluate_binding", "evaluate_binding_sets"]
