"""Nested messages (dicts, lists, tuples of tensors and arrays): mapped leaf by leaf, and their
size on the wire."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch


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


def finite(tree: Any) -> bool:
    """Whether every floating-point tensor in ``tree`` is free of NaN and infinity."""
    return all(bool(torch.isfinite(t).all()) for t in leaves(tree, torch.Tensor)
               if t.is_floating_point())


def tensor_bytes(message) -> int:
    """Bytes on the wire for a message: tensors and arrays by size, Python scalars as 8 bytes."""
    if message is None:
        return 0
    if torch.is_tensor(message):
        return message.numel() * message.element_size()
    if isinstance(message, np.ndarray):
        return message.nbytes
    if isinstance(message, dict):
        return sum(tensor_bytes(v) for v in message.values())
    if isinstance(message, (list, tuple)):
        return sum(tensor_bytes(v) for v in message)
    return 8
