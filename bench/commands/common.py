"""The commands' console helpers: they live in `bench.core.console`, below the CLI, so that
evaluators and leaderboards print and render tables without importing the CLI."""

from __future__ import annotations

from typing import Any, Callable

from typer.core import TyperCommand

from bench.core.console import TABLE_WIDTH, Format, echo, progress_bar, render_table, stderr, wrap
from bench.core.errors import BenchError

__all__ = ["TABLE_WIDTH", "Format", "echo", "parse_floats", "progress_bar", "registry_help", "render_table", "stderr",
           "wrap"]


def parse_floats(text: str | None, name: str) -> tuple[float, ...] | None:
    """Comma-separated numbers (`--mean 0.5,0.5,0.5`), None when the option was not given; one
    line on anything else. How many there must be is the receiver's check."""
    if text is None:
        return None
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise BenchError(f"{name}: comma-separated numbers R,G,B, got {text!r}") from None


def registry_help(helps: dict[str, Callable[[], str]]) -> type[TyperCommand]:
    """A command class whose options' help texts (`helps`: parameter name -> text) are read
    from the registries when `--help` is shown, not when the CLI starts: a registry loads
    its plugins on first use, and every other command should not pay for that."""

    class RegistryHelpCommand(TyperCommand):
        def format_help(self, ctx: Any, formatter: Any) -> Any:
            for param in self.params:
                if param.name in helps:
                    param.help = helps[param.name]()  # type: ignore[attr-defined]
            return super().format_help(ctx, formatter)

    return RegistryHelpCommand
