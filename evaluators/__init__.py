"""Backbones, activation caches, probes and metrics; they read datasets and write results."""
