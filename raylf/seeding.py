"""Every random choice of an experiment flows from the trial seed through named streams.

A stream is keyed by (seed, purpose, *indices), so the partition, the participation of round r
and client k's shuffling in round r are the same whichever backend or worker computes them.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

_PURPOSES = ("partition", "split", "participation", "client", "init", "method", "evaluate",
             "search")


def _key(seed: int, purpose: str, *indices: int) -> list[int]:
    if purpose not in _PURPOSES:
        raise ValueError(f"unknown random stream {purpose!r}")
    return [int(seed), zlib.crc32(purpose.encode()), *(int(i) for i in indices)]


def stream(seed: int, purpose: str, *indices: int) -> np.random.Generator:
    return np.random.default_rng(_key(seed, purpose, *indices))


def derive(seed: int, purpose: str, *indices: int) -> int:
    """A 63-bit integer seed for torch generators."""
    state = np.random.SeedSequence(_key(seed, purpose, *indices)).generate_state(2, np.uint32)
    return int(state[0]) << 31 ^ int(state[1])


def client_seed(seed: int, rnd: int, cid: int) -> int:
    """Client ``cid``'s seed of round ``rnd``, the ``seed`` its local update is handed: a
    ``FitPlan``, declared without it, derives its own streams from it here."""
    return derive(seed, "client", rnd, cid)


def generator(seed: int, *indices: int) -> torch.Generator:
    """A torch generator for a method's own random choices (a data subset, noise), drawn from
    the client's round seed on the ``method`` stream so it never repeats the trainer's
    shuffling, which is seeded by ``seed`` itself."""
    return torch.Generator().manual_seed(derive(seed, "method", *indices))
