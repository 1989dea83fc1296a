"""The binding task: what probes are trained against (`task`), the probes of a family (`jobs`),
scores to result columns (`columns`), the rows of a run (`rows`) and the run itself (`run`).

Its `Task` record (`TASK`, registered by bench/core/tasks.py under "binding") is here, and nothing
else: the registry reads it without importing torch (`bench evaluate --help` lists the tasks)."""

from bench.core.tasks import Metric, Task


def _metric(name: str, label: str, unit: str, higher_is_better: bool = True) -> Metric:
    return Metric(name, label, "binding", unit, higher_is_better, screened=True)


#: This task's record (bench/core/tasks.py registers it under "binding").
TASK = Task(
    summary="B, β, β* from F/O probes",
    probes="evaluators.probes.families:BINDING_PROBES",
    runner="evaluators.tasks.binding.run:run_binding",
    fills_also=True,
    ray_runner="evaluators.runner.ray_executor:run_binding",
    metric="beta_star",
    metrics=(
        # headline: the chain rule on prior-anchored probes
        _metric("beta_star", "β*", "%"),
        _metric("beta_star_paper", "β*_paper", "%"),
        _metric("B_star", "B*", "bits"),
        _metric("B_star_paper", "B*_paper", "bits"),
        _metric("beta_O", "β_O", "%"),
        _metric("beta_O_paper", "β_O_paper", "%"),
        _metric("B_O", "B_O", "bits"),
        _metric("B_O_paper", "B_O_paper", "bits"),
        _metric("beta_F", "β_F", "%"),
        _metric("B_F", "B_F", "bits"),
        _metric("B_F_paper", "B_F_paper", "bits"),
        _metric("L_F", "L_F", "bits", higher_is_better=False),
        _metric("L_O_given_F", "L_O|F", "bits", higher_is_better=False),
        _metric("L_O", "L_O", "bits", higher_is_better=False),
        _metric("L_O_paper", "L_O_paper", "bits", higher_is_better=False),
        _metric("L_F_paper", "L_F_paper", "bits", higher_is_better=False),
        _metric("bit_accuracy", "bit accuracy", "%"),
        _metric("exact_accuracy", "exact-match accuracy", "%"),
    ),
    default_layers="last",
    default_probes=("linear", "quadratic", "dnn"),
    token_choices=("cls",),
    # `resampled-o` replaces every scene's O by a fresh draw from the generator's exact p(O | F),
    # independent of the image, so every backbone's true β* is 0
    controls=("resampled-o",),
    needs_codes=True,
    check="evaluators.tasks.binding.request:check_request",
    request="evaluators.tasks.binding.request:request_fields",
    hparams=True,
    check_dataset="evaluators.tasks.binding.task:check_dataset",
    summary_columns=("backbone", "layer", "tokens", "probe", "seed", "status", "L_F", "L_O_given_F", "beta_O",
                     "beta_star", "beta_star_lo", "beta_star_hi", "beta_star_paper", "exact_accuracy", "best_epoch",
                     "checks", "error"),
    short_metrics=(("β* %", "beta_star"), ("β_O %", "beta_O")),
    short_keys=("backbone", "layer", "tokens", "probe", "seed"),
    sensitivity=True,
    board_metrics=("beta_star", "beta_star_paper", "beta_O", "beta_F"),
    compare_metrics=("beta_star", "B_star", "beta_O", "beta_F", "beta_star_paper"),
    per_scene=True,
    title="Binding",
    report_section="leaderboards.sections:binding_section",
)
