"""The commands' console helpers: they live in `bench.console`, below the CLI, so that
evaluators and leaderboards print and render tables without importing the CLI."""

from bench.console import TABLE_WIDTH, Format, echo, progress_bar, render_table, stderr

__all__ = ["TABLE_WIDTH", "Format", "echo", "progress_bar", "render_table", "stderr"]
