"""BindingBench: synthetic benchmarks that measure object binding in vision backbones.

`bench` holds the small shared core (scene codes, errors, dataset I/O, hashing) and the
Typer CLI. The core imports none of `generators`, `evaluators` or `leaderboards`.
"""

__version__ = "0.1.0"
