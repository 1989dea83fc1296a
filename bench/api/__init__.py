"""The public Python API, and the one front door of the `bench` CLI: generate a dataset, evaluate
models, load a results folder, rank it, draw it, write the report or the site, run a study, list
and train models.

    from bench import api

    data = api.generate("colorshape", preset="small", out="data/cs")
    df = api.evaluate(["pixels", "oracle:objects"], data, probes=["linear"])
    board = api.leaderboard(df, metric="beta_star")

Every function takes keyword arguments with the CLI's defaults and returns a path, records or
pandas DataFrames, so a notebook computes the rows `bench evaluate` computes and reads them the
way `bench leaderboard` does (each backbone's newest weights and probe settings; what was
set aside is in `df.attrs["set_aside"]`). Each command of `bench` is one of these functions with a
command line around it: the commands (`bench/commands/`) call only the names in `__all__` and the
shared core `bench.core` (tests/test_layers.py). Bad input raises `BenchError` with one line.

The functions live by topic in this package's modules (data, evaluation, boards, studies, models,
registries); each imports its heavy dependencies (torch, pandas, matplotlib) inside its body, so
`import bench.api`, and `bench --help`, load none of them.
"""

from __future__ import annotations

from bench.api.boards import compare, leaderboard_table, plot, report, site
from bench.api.data import GeneratorSummary, generate, generators, import_dataset, preview
from bench.api.interventions import (fit_subspace, load_subspace, parse_intervention, principal_angles,
                                     save_subspace, subspace_angles, write_subspace)
from bench.api.evaluation import (EvaluationRun, ToyAnalysis, evaluate, evaluate_run, leaderboard, load_results,
                                  toys_analysis)
from bench.api.models import (BackboneListing, cache_entries, extract, models, remove_cache_entries, train_zoo,
                              zoo_inventory, zoo_path)
from bench.api.registries import (layers_help, metrics_help, probes_help, tasks_help, tokens_filter_help,
                                  tokens_help)
from bench.api.studies import (StudyOutcome, load_study, plan_study, run_and_report, run_study, shipped_studies,
                               study_next_commands, study_plan_lines, study_report, study_site)
from bench.core.errors import BenchError

__all__ = [
    "BackboneListing", "BenchError", "EvaluationRun", "GeneratorSummary", "StudyOutcome", "ToyAnalysis",
    "cache_entries", "compare", "evaluate", "evaluate_run", "extract", "fit_subspace", "generate", "generators",
    "import_dataset", "load_subspace", "parse_intervention", "principal_angles", "save_subspace", "subspace_angles",
    "write_subspace",
    "layers_help", "leaderboard", "leaderboard_table", "load_results", "load_study", "metrics_help", "models",
    "plan_study", "plot", "preview", "probes_help", "remove_cache_entries", "report", "run_and_report", "run_study",
    "shipped_studies", "site", "study_next_commands", "study_plan_lines", "study_report", "study_site",
    "tasks_help", "tokens_filter_help", "tokens_help", "toys_analysis", "train_zoo", "zoo_inventory", "zoo_path",
]
