"""Reading a study file's text: the one-line refusals that name the file and key path
(`Checker`), `${VAR}` references filled from variables or the environment (`Resolver`), and paths
written relative to the study file's folder. `bench.studies.spec` builds the typed study on these.

`${VAR}` and `${VAR:-default}` in a string take a value from `variables` (`--set VAR=VALUE`)
or the environment. A string that is a single reference takes the type TOML reads its value
as (`${N_TRAIN:-800}` is the number 800), and one that comes out empty leaves its key out (the
key's default applies). Relative paths (a dataset `path`, an import's `src`, a checkpoint
folder, a `py:` file, a timm state-dict file) resolve from the study file's folder.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Mapping

from bench.core.errors import BenchError
from bench.core.labels import check_label

try:  # Python 3.11+; `tomli` is the same parser, for 3.10
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib  # type: ignore[no-redef]

VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class Checker:
    """Raises the one-line errors of a study file: `FILE: KEY.PATH: message`."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, message: str) -> BenchError:
        return BenchError(f"{self.source}: {key}: {message}")

    def not_empty(self, spec: str, key: str) -> None:
        """Refuse an empty spec: it names no backbone (resolved from the study's folder, it named that folder)."""
        if not spec.strip():
            raise self.fail(key, "empty spec; name a backbone (`bench models` lists them)")

    def label(self, value: str, key: str, what: str) -> None:
        """Refuse, at `key`, a name that is not a label (`bench.core.labels`: it names rows and folders)."""
        try:
            check_label(value, what)
        except BenchError as e:
            raise self.fail(key, str(e)) from None

    def table(self, value: Any, key: str, allowed: Mapping[str, Any], required: tuple[str, ...] = ()) -> dict:
        """`value` as a table with only `allowed` keys (each of its type) and every `required` one."""
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a table, got {type_name(value)}")
        for k, v in value.items():
            where = f"{key}.{k}" if key else k
            if k not in allowed:
                close = difflib.get_close_matches(k, list(allowed), n=1, cutoff=0.6)
                hint = f"did you mean {close[0]}?" if close else f"allowed: {', '.join(allowed)}"
                raise self.fail(where, f"unknown key; {hint}")
            self.typed(v, where, allowed[k])
        for k in required:
            if k not in value:
                raise self.fail(f"{key}.{k}" if key else k, "missing (required)")
        return value

    def typed(self, value: Any, key: str, types: Any) -> Any:
        types = types if isinstance(types, tuple) else (types,)
        ok = any(isinstance(value, t) and not (isinstance(value, bool) and t in (int, float)) for t in types)
        if not ok:
            names = " or ".join({str: "a string", int: "an integer", float: "a number", bool: "true or false",
                                 list: "an array", dict: "a table"}[t] for t in types)
            raise self.fail(key, f"expected {names}, got {type_name(value)}")
        return value

    def items(self, value: Any, key: str, types: Any) -> list:
        """A scalar or an array of them, as a list, each element checked (`key[i]` names a bad one)."""
        values = value if isinstance(value, list) else [value]
        for i, v in enumerate(values):
            self.typed(v, f"{key}[{i + 1}]" if isinstance(value, list) else key, types)
        return values


def type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "a table"}.get(type(value), type(value).__name__)


class Resolver:
    """Fills `${VAR}` references in every string of the parsed file, recording what it read."""

    def __init__(self, check: Checker, given: Mapping[str, str], allow_unset: bool) -> None:
        self.check, self.given, self.allow_unset = check, given, allow_unset
        self.read: set[str] = set()
        self.values: dict[str, str] = {}
        self.unset: set[str] = set()
        self.by_key: dict[str, set[str]] = {}

    def walk(self, value: Any, key: str) -> Any:
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                v = self.walk(v, f"{key}.{k}" if key else k)
                if v is not LEFT_OUT:
                    out[k] = v
            return out
        if isinstance(value, list):
            return [w for w in (self.walk(v, f"{key}[{i + 1}]") for i, v in enumerate(value)) if w is not LEFT_OUT]
        if isinstance(value, str) and "${" in value:
            return self._fill(value, key)
        return value

    def _fill(self, text: str, key: str) -> Any:
        def value_of(m: re.Match) -> str:
            var, default = m.group(1), m.group(2)
            self.read.add(var)
            self.by_key.setdefault(key.split(".")[0] if not key.startswith("datasets") else "datasets", set()).add(var)
            if var in self.given:
                value = self.given[var]
            elif var in os.environ:
                value = os.environ[var]
            elif default is not None:
                value = default
            elif self.allow_unset:
                self.unset.add(var)
                return m.group(0)
            else:
                raise self.check.fail(key, f"${{{var}}} is not set; pass --set {var}=VALUE or export {var}")
            self.values[var] = value
            return value

        whole = VAR.fullmatch(text)
        filled = VAR.sub(value_of, text)
        if not whole or filled == text:
            return filled
        if filled == "":
            return LEFT_OUT
        try:  # a whole reference takes the type TOML reads its value as: 48 a number, /data a string
            return tomllib.loads(f"v = {filled}")["v"]
        except tomllib.TOMLDecodeError:
            return filled


LEFT_OUT = object()


class AnyKey(dict):
    """`set`'s allowed keys: any (the generator's config checks them), any scalar type."""

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> tuple:
        return (str, int, float, bool, list)


def resolve_path(text: str, root: Path) -> Path:
    """`text` as a path, a relative one from `root` (the study file's folder)."""
    path = Path(text).expanduser()
    return path if path.is_absolute() else root / path


def spec_path(spec: str, root: Path) -> str:
    """A spec with its relative file or folder resolved from the study's folder (a checkpoint
    folder `./ckpt`, `py:FILE:FUNCTION`, `timm:ARCH@FILE`); other specs as written."""
    if spec.startswith((".", "~")) or (spec.startswith("/") is False and (root / spec).is_dir()):
        return str(resolve_path(spec, root))
    if spec.startswith("py:"):
        file, sep, function = spec[3:].rpartition(":")
        return f"py:{resolve_path(file, root)}{sep}{function}" if sep else spec
    if spec.startswith("timm:") and "@" in spec:
        arch, _, file = spec.partition("@")
        if Path(file).suffix in (".pth", ".pt", ".safetensors", ".bin"):
            return f"{arch}@{resolve_path(file, root)}"
    return spec
