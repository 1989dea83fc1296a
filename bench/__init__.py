"""BindingBench: synthetic benchmarks that measure object binding in vision backbones.

Layers, bottom up: `bench.core` (codes, errors, dataset and results files, hashing, the
registry); `generators`, `evaluators` and `leaderboards` above it; `bench.api` above those; the
Typer CLI (`bench.cli`, `bench.commands`) on top. Each imports only from the layers below.
"""

from bench.core.numerics import reproducible_numerics

__version__ = "0.1.0"

reproducible_numerics()  # before torch first runs a product (bench/core/numerics.py)
