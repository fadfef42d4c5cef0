"""A small generic registry: names to objects, registered by decorator, as lazy ``"module:attr"`` strings, or by
other installed packages through a Python entry point group.

Lazy strings keep imports light (no torch until a model is actually loaded). Entry points are read on first use of a
registry that names a group, once per process; each lazy string is imported once (an import that failed is reported
again on each use, not retried). Unknown names get a "Did you mean" hint; registering a name twice is an error.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, error: type[Exception] = KeyError, entry_point_group: str | None = None):
        self.kind = kind
        self.error = error
        self.entry_point_group = entry_point_group
        self._entries: dict[str, T | str] = {}
        self._origin: dict[str, str] = {}
        self._plugins_loaded = entry_point_group is None
        self._plugin_error: Exception | None = None  # a conflicting plugin: raised on every use, not only the first
        self._import_errors: dict[str, tuple[str, str, Exception]] = {}  # name -> ("module:attr", message, cause)

    def register(self, name: str, obj: T | str | None = None) -> Callable[[T], T] | None:
        """``registry.register("x", obj)``, ``registry.register("x", "pkg.mod:attr")`` or ``@registry.register("x")``."""
        if obj is not None:
            self._add(name, obj)
            return None

        def decorator(target: T) -> T:
            self._add(name, target)
            return target

        return decorator

    def _add(self, name: str, obj: T | str, origin: str = "clipcache") -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered (by {self._origin.get(name, 'clipcache')})")
        self._entries[name] = obj
        self._origin[name] = origin

    def _load_plugins(self) -> None:
        if self._plugin_error is not None:
            raise self._plugin_error
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=self.entry_point_group or ""):
            origin = f"entry point {ep.name} = {ep.value} ({ep.dist.name if ep.dist else 'unknown package'})"
            if ep.name in self._entries:
                self._plugin_error = self.error(
                    f"{origin} registers {self.kind} {ep.name!r}, which is already registered by "
                    f"{self._origin[ep.name]}; uninstall one of the two packages")
                raise self._plugin_error
            self._add(ep.name, ep.value, origin)

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def names(self) -> list[str]:
        self._load_plugins()
        return sorted(self._entries)

    def in_order(self, plugins: bool = True) -> list[str]:
        """The names in the order they were registered (installed plugins' after clipcache's own; with
        ``plugins=False`` the entry points are not read)."""
        if plugins:
            self._load_plugins()
        return list(self._entries)

    def own_names(self) -> list[str]:
        """The names registered in this process (clipcache's own, and any ``register`` call), sorted; the entry
        points are not read, nor any plugin imported."""
        return sorted(name for name, origin in self._origin.items() if origin == "clipcache")

    def origin(self, name: str) -> str:
        """Who registered ``name``: ``clipcache`` (in this process) or the entry point (read only for a name not
        registered here)."""
        if name not in self._origin:
            self._load_plugins()
        return self._origin[name]

    def suggest(self, name: str) -> str:
        close = difflib.get_close_matches(name, self.names(), n=3, cutoff=0.6)
        return f" Did you mean: {', '.join(close)}?" if close else ""

    def get(self, name: str, *, plugins: bool = True) -> T:
        """The object registered as ``name``, imported on first use; ``plugins=False``: among the names registered in
        the process only, without reading the entry points."""
        if plugins:
            self._load_plugins()
        if name not in self._entries:
            raise self.error(f"Unknown {self.kind} {name!r}.{self.suggest(name)}")
        obj = self._entries[name]
        if isinstance(obj, str):
            failed = self._import_errors.get(name)
            if failed is not None and failed[0] == obj:  # imported once: a module that failed is not run again
                raise self.error(failed[1]) from failed[2]
            module, _, attr = obj.partition(":")
            try:
                obj = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as e:
                message = f"{self.kind} {name!r} ({self._origin[name]}) cannot be imported: {type(e).__name__}: {e}"
                self._import_errors[name] = (obj, message, e)
                raise self.error(message) from e
            self._entries[name] = obj
        return obj

    def items(self) -> list[tuple[str, Any]]:
        return [(name, self.get(name)) for name in self.names()]
