"""Input normalization: the one map from a source's [0, 1] inputs to what the models see.

``dataset.normalize`` picks it: ``standard`` subtracts a per-channel mean and divides by a
per-channel std (axis 1 of the inputs: the channel of N×C×H×W images, the feature of N×F
tables), either the source's published constants (torchvision's sets) or the statistics of the
pooled training split of the federation, so validation and test data never leak into them;
``unit`` keeps the source's own scale ([0, 1] for images, floats as given); ``none`` gives the
raw values (uint8 pixels as 0–255).
Token ids (int64) are never touched. The statistics are computed once, on the driver, from
unrotated inputs (exact for rotations by multiples of 90°) and travel with the federation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raylf.data.ragged import Ragged

_CHUNK_VALUES = 1 << 22  # values per pass step (32 MiB as float64), never a whole float64 copy
_MIN_STD = 1e-8  # a constant channel or feature is only centred, never divided by ~0


@dataclass(frozen=True)
class Normalization:
    """``mode`` and, for ``standard``, the per-channel ``mean`` / ``std`` (on the [0, 1] scale)
    and where they came from; ``raw_scale`` is the raw value of 1.0 (``none`` multiplies by it)."""

    mode: str = "unit"
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    origin: str | None = None
    raw_scale: float = 1.0

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` normalized in place (float inputs; integer token ids are returned as they are)."""
        if not x.is_floating_point() or x.ndim < 2:
            return x
        if self.mode == "none" and self.raw_scale != 1.0:
            return x.mul_(self.raw_scale)
        if self.mode == "standard":
            shape = (1, -1) + (1,) * (x.ndim - 2)
            mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(shape)
            std = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(shape)
            return x.sub_(mean).div_(std)
        return x

    def columns(self) -> dict[str, Any]:
        """The trials-table columns saying what was applied (the mode in effect, defaults
        included, and for ``standard`` the per-channel constants and their origin)."""
        return {"normalize": self.mode,
                "normalize_mean": json.dumps(list(self.mean)) if self.mean else None,
                "normalize_std": json.dumps(list(self.std)) if self.std else None,
                "normalize_from": self.origin}


def channel_stats(x: np.ndarray, rows: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and (population) std of ``x[rows]`` over every axis but axis 1, in two
    chunked float64 passes (exact where E[x²] − E[x]² would cancel)."""
    rows = np.sort(rows)
    axes = (0, *range(2, x.ndim))
    per_sample = int(np.prod(x.shape[2:], dtype=np.int64))
    count = len(rows) * per_sample
    step = max(1, _CHUNK_VALUES // max(1, int(np.prod(x.shape[1:], dtype=np.int64))))
    total = np.zeros(x.shape[1])
    for start in range(0, len(rows), step):
        total += x[rows[start: start + step]].sum(axis=axes, dtype=np.float64)
    mean = total / count
    shape = (1, -1) + (1,) * (x.ndim - 2)
    squares = np.zeros(x.shape[1])
    for start in range(0, len(rows), step):
        centred = x[rows[start: start + step]].astype(np.float64) - mean.reshape(shape)
        squares += np.square(centred).sum(axis=axes)
    std = np.sqrt(squares / count)
    std[std < _MIN_STD] = 1.0
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def normalization_for(mode: str, source, train: list[np.ndarray]) -> Normalization:
    """The normalization ``mode`` gives ``source`` with these per-client training indices."""
    scale = source.raw_scale
    if mode != "standard" or not np.issubdtype(source.x.dtype, np.floating):
        return Normalization(mode, raw_scale=scale)
    if source.published_stats is not None:
        mean, std = source.published_stats
        return Normalization(mode, tuple(mean), tuple(std), "published constants", scale)
    rows = Ragged.from_parts(train).flat
    mean, std = channel_stats(source.x, rows)
    return Normalization(mode, mean, std, "training split", scale)
