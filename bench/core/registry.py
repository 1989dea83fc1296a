"""One small registry pattern for every name a user picks (backbone source, probe family,
tokens choice, generator, metric), in the spirit of timm's `register_model` / `list_models`.

A `Registry[T]` maps names to entries in registration order (the order help texts and
table columns use). Built-in entries are registered by decorators when their module is
imported; a registry names those modules (`builtins`) and imports them on first use, so
listing names costs no import of what is not needed. Third-party packages add entries
through Python entry points: on first use the registry loads every entry point of its
`group` (`bindingbench.backbones`, `bindingbench.binding_probes`, `bindingbench.tasks`, ...).
An entry point names a module (`pkg.plugin`), whose import registers entries with the
same decorators, or a function (`pkg.plugin:register`), which is called once with no
arguments. A group is loaded once per process, whichever registry reads it first.
"""

from __future__ import annotations

import difflib
import importlib
from importlib.metadata import entry_points
from typing import Any, Callable, Generic, Iterator, Sequence, TypeVar, overload

from bench.core.errors import BenchError

T = TypeVar("T")

_LOADED_GROUPS: set[str] = set()


def load_entry_points(group: str) -> None:
    """Import (or call) every entry point of `group`, once per process.

    A plugin that fails to load is a one-line BenchError naming it, not a traceback:
    the user's command cannot run with half a registry."""
    if group in _LOADED_GROUPS:
        return
    _LOADED_GROUPS.add(group)  # before loading: a plugin that reads a registry must not recurse
    for ep in sorted(entry_points(group=group), key=lambda e: e.name):
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, type):
                obj()
        except Exception as e:  # noqa: BLE001 - any failure in foreign code is reported the same way
            raise BenchError(f"plugin: {group} entry point {ep.name!r} ({ep.value}) failed: "
                             f"{type(e).__name__}: {e}".splitlines()[0]) from e


def load_ref(ref: Any) -> Any:
    """An object given as `module:name` (imported on first use, so a registry's module stays free
    of torch) or as itself: how entries name their classes, hooks and runners."""
    if not isinstance(ref, str):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


class Registry(Generic[T]):
    """Named entries of one kind; `kind` starts every error message (`probe: unknown 'mlp'; ...`).

    `group`: its entry-point group, or several (a renamed group's old name still read).
    `builtins`: modules whose import registers the built-in entries, or functions that do."""

    def __init__(self, kind: str, *, group: str | Sequence[str] | None = None,
                 builtins: Sequence[str | Callable[[], None]] = ()) -> None:
        self.kind = kind
        self.groups = (group,) if isinstance(group, str) else tuple(group or ())
        self._builtins = tuple(builtins)
        self._entries: dict[str, T] = {}
        self._loaded = False

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, entry: T) -> T: ...

    def register(self, name: str, entry: T | None = None) -> T | Callable[[T], T]:
        """Add `entry` under `name`, or, without `entry`, a decorator that adds what it decorates.

        Registering a different entry under a taken name is an error (two plugins that
        claim one name must not silently shadow each other); the same entry again is a no-op."""
        if entry is None:
            return lambda obj: self.register(name, obj)
        if not name or name != name.strip():
            raise ValueError(f"{self.kind}: a registered name must be non-empty without outer spaces, got {name!r}")
        if name in self._entries and self._entries[name] is not entry:
            raise BenchError(f"{self.kind}: {name!r} is registered twice")
        self._entries[name] = entry
        return entry

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for module in self._builtins:
            module() if callable(module) else importlib.import_module(module)
        for group in self.groups:
            load_entry_points(group)

    def names(self) -> tuple[str, ...]:
        """Every name, built-ins first in their registration order, then plugins'."""
        self._load()
        return tuple(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        self._load()
        return iter(list(self._entries.items()))

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def get(self, name: str) -> T:
        """The entry named `name`; an unknown name is a one-line BenchError listing the known ones."""
        self._load()
        if name not in self._entries:
            raise self.unknown(name)
        return self._entries[name]

    def check(self, names: Sequence[str]) -> None:
        """Raise `unknown` for the first name that is not registered."""
        for name in names:
            self.get(name)

    def unknown(self, name: str) -> BenchError:
        """`kind: unknown 'x'; allowed: a, b (did you mean b?)`."""
        known = self.names()
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return BenchError(f"{self.kind}: unknown {name!r}; allowed: {', '.join(known)}{hint}")
