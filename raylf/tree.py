"""Nested messages (dicts, lists, tuples of tensors and arrays) mapped leaf by leaf."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def map_leaves(tree: Any, fn: Callable[[Any], Any], leaf: type | tuple[type, ...]) -> Any:
    """``tree`` with ``fn`` applied to every value of type ``leaf``; other values unchanged."""
    if isinstance(tree, leaf):
        return fn(tree)
    if isinstance(tree, dict):
        return {k: map_leaves(v, fn, leaf) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(map_leaves(v, fn, leaf) for v in tree)
    return tree


def leaves(tree: Any, leaf: type | tuple[type, ...]) -> list[Any]:
    """Every value of type ``leaf`` in ``tree``."""
    found: list[Any] = []
    map_leaves(tree, found.append, leaf)
    return found
