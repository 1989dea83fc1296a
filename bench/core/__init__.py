"""The shared core every layer stands on: scene codes, errors, dataset and results files,
hashing, locks and output folders, console helpers, the registry.

It imports nothing from `generators`, `evaluators`, `leaderboards`, `bench.api` or the CLI, so
any of them can use it without an import running back up (tests/test_layers.py checks this).
"""
