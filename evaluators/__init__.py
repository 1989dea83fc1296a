"""Backbones, activation caches, probes and metrics; they read datasets and write results."""

from bench.core.numerics import reproducible_numerics

reproducible_numerics()  # before torch first runs a product (bench/core/numerics.py)
