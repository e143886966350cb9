"""Named components (datasets, scenarios, models, methods) looked up by the name a spec gives."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownName(KeyError):
    """A spec named a component that is not registered; the message lists the allowed names."""

    def __init__(self, kind: str, name: str, allowed: list[str]):
        self.kind, self.name, self.allowed = kind, name, allowed
        super().__init__(f"unknown {kind} {name!r}; allowed: {', '.join(allowed)}")

    def __str__(self) -> str:
        return self.args[0]


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = item
            return item

        return add

    @contextmanager
    def temporarily(self, name: str, item: T) -> Iterator[T]:
        """``item`` registered under ``name`` inside a ``with`` block only: a class can be run
        through specs (``raylf.testing.check_method``) without joining the registry for good."""
        self.register(name)(item)
        try:
            yield item
        finally:
            del self._items[name]

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownName(self.kind, name, self.names()) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items
