"""Per-client index lists stored as one flat array plus offsets (CSR), with the operations a
partition needs done for all clients at once.

A million clients as a Python list of a million small arrays costs a minute to split and another
to pickle into every worker; as two arrays it costs a sort and a memcpy. ``Ragged`` still reads
like the list it replaces (``len``, ``[k]``, iteration), so code that handles a few clients by
index does not change.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Ragged(Sequence):
    """``flat[offsets[k]:offsets[k + 1]]`` are client k's indices."""

    flat: np.ndarray
    offsets: np.ndarray

    @classmethod
    def from_parts(cls, parts: Sequence[np.ndarray]) -> Ragged:
        if isinstance(parts, Ragged):
            return parts
        lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
        flat = np.concatenate(parts).astype(np.int64) if len(parts) else np.zeros(0, np.int64)
        return cls(flat, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))

    @classmethod
    def from_lengths(cls, flat: np.ndarray, lengths: np.ndarray) -> Ragged:
        return cls(np.asarray(flat, dtype=np.int64),
                   np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))

    @classmethod
    def empty(cls, num: int) -> Ragged:
        return cls(np.zeros(0, np.int64), np.zeros(num + 1, np.int64))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, k):
        if not isinstance(k, (int, np.integer)):
            raise TypeError("index a Ragged with one client id; use take() for several")
        k = int(k) + len(self) if k < 0 else int(k)
        if not 0 <= k < len(self):
            raise IndexError(k)
        return self.flat[self.offsets[k]:self.offsets[k + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self.flat[a:b] for a, b in zip(self.offsets[:-1], self.offsets[1:]))

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def owners(self) -> np.ndarray:
        """The client (position) of every element of ``flat``."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.lengths)

    def positions(self) -> np.ndarray:
        """Each element's position within its client's list."""
        return np.arange(len(self.flat), dtype=np.int64) - np.repeat(self.offsets[:-1],
                                                                      self.lengths)

    def take(self, clients: np.ndarray) -> Ragged:
        """The lists of ``clients``, in that order, as a new Ragged."""
        clients = np.asarray(clients, dtype=np.int64)
        starts, lengths = self.offsets[clients], self.lengths[clients]
        out = Ragged.from_lengths(np.zeros(0), lengths)
        rows = np.arange(out.offsets[-1], dtype=np.int64) + np.repeat(
            starts - out.offsets[:-1], lengths)
        return Ragged(self.flat[rows], out.offsets)

    def shuffled(self, rng: np.random.Generator) -> Ragged:
        """Every list in its own random order: one seeded key per element in [0, 1) added to its
        client's position, then one sort (clients stay in place, their elements shuffle)."""
        order = np.argsort(self.owners() + rng.random(len(self.flat)))
        return Ragged(self.flat[order], self.offsets)

    def sorted(self) -> Ragged:
        """Every list in ascending order (one sort of client-major keys)."""
        if not len(self.flat):
            return self
        base = self.owners() * (int(self.flat.max()) + 1)
        return Ragged(np.sort(base + self.flat) - base, self.offsets)

    def cut(self, heads: np.ndarray) -> tuple[Ragged, Ragged]:
        """Each list's first ``heads[k]`` elements, and the rest."""
        first = self.positions() < np.repeat(heads, self.lengths)
        return (Ragged.from_lengths(self.flat[first], heads),
                Ragged.from_lengths(self.flat[~first], self.lengths - heads))
