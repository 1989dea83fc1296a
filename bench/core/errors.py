"""User-facing errors.

Anything a user can get wrong (a config value, a path, a spec string) raises
`BenchError`; the CLI turns it into one line on stderr and exit code 2, so
internal bugs (any other exception) stay distinguishable from bad input.
"""

from __future__ import annotations


class BenchError(ValueError):
    """Bad input: the message names the offending value and what is allowed."""


class ConfigError(BenchError):
    """A configuration parameter is invalid or the configuration is impossible."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
