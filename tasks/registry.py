"""A small generic registry: names to objects, registered by decorator or as lazy ``"module:attr"`` strings.

Lazy strings keep ``import tasks`` light (no torch until a model is actually loaded). Unknown names get a
"Did you mean" hint; registering a name twice is an error.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, error: type[Exception] = KeyError):
        self.kind = kind
        self.error = error
        self._entries: dict[str, T | str] = {}

    def register(self, name: str, obj: T | str | None = None) -> Callable[[T], T] | None:
        """``registry.register("x", obj)``, ``registry.register("x", "pkg.mod:attr")`` or ``@registry.register("x")``."""
        if obj is not None:
            self._add(name, obj)
            return None

        def decorator(target: T) -> T:
            self._add(name, target)
            return target

        return decorator

    def _add(self, name: str, obj: T | str) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = obj

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def names(self) -> list[str]:
        return sorted(self._entries)

    def suggest(self, name: str) -> str:
        close = difflib.get_close_matches(name, self._entries.keys(), n=3, cutoff=0.6)
        return f" Did you mean: {', '.join(close)}?" if close else ""

    def get(self, name: str) -> T:
        if name not in self._entries:
            raise self.error(f"Unknown {self.kind} {name!r}.{self.suggest(name)}")
        obj = self._entries[name]
        if isinstance(obj, str):
            module, _, attr = obj.partition(":")
            obj = getattr(importlib.import_module(module), attr)
            self._entries[name] = obj
        return obj  # type: ignore[return-value]
