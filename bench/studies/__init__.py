"""Studies: one TOML file names a whole comparison, and `bench run` makes what it lacks.

`spec` reads and checks a study file whole (`load_study`), `planning` works out what a run
will do without loading a model (`plan_study`), `runner` does it (`run_study`) and shows the
result (`study_report`, the one place the study's site will be built). The shipped studies
are the `*.toml` files beside this module (package data): `demo`, `fbp`, `obv`, and the
ablation studies `zoo-ablation` (offline) and `obv-ablation` (needs downloads); `sweeps` expands
an evaluate block's intervention sweep.
"""
