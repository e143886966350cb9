"""Client-level differential privacy for uploads: clipping, the Gaussian mechanism, accounting.

A client clips the vector it uploads to L2 norm ≤ ``clip_norm`` and adds N(0, σ²I) with the
classical calibration σ = clip_norm·sqrt(2 ln(1.25/δ))/ε, so every round it takes part in is an
(ε, δ) Gaussian mechanism on its data. Over R rounds the guarantee composes; the composed ε at
the same δ comes from Google's ``dp-accounting`` privacy-loss-distribution (PLD) accountant,
which is tight for repeated Gaussian mechanisms (RDP would overstate it by ~10 %).

Scale warning: for ε ≈ 1, σ ≈ 5·clip_norm, i.e. the noise has about 5·sqrt(dim) times the norm
of the clipped vector. A model averaged from a handful of noisy uploads is near chance; only
many clients (noise std falls as 1/sqrt(K)) average it down.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from pydantic import BaseModel, ConfigDict, Field


class DPParams(BaseModel):
    """Gaussian mechanism on each upload; off when ``epsilon`` is null."""

    model_config = ConfigDict(extra="forbid")

    epsilon: float | None = Field(None, gt=0, description="per-round ε; null = no DP")
    delta: float = Field(1e-5, gt=0, lt=1)
    clip_norm: float = Field(1.0, gt=0, description="L2 bound of the uploaded vector")

    @property
    def enabled(self) -> bool:
        return self.epsilon is not None

    @property
    def sigma(self) -> float:
        return gaussian_sigma(self.epsilon, self.delta, self.clip_norm)


def gaussian_sigma(epsilon: float, delta: float, clip_norm: float = 1.0) -> float:
    """Noise std of the classical Gaussian mechanism for L2 sensitivity ``clip_norm``."""
    return clip_norm * math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def clip(vector: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """Scale ``vector`` down to L2 norm ``clip_norm`` if it is longer (never scaled up)."""
    norm = float(vector.norm())
    return vector * (clip_norm / norm) if norm > clip_norm else vector.clone()


def privatize(vector: torch.Tensor, dp: DPParams, seed: int) -> torch.Tensor:
    """Clip, then add N(0, σ²I) drawn from a generator seeded by ``seed`` (reproducible)."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(vector.shape, generator=gen, dtype=vector.dtype) * dp.sigma
    return clip(vector, dp.clip_norm) + noise.to(vector.device)


@lru_cache(maxsize=256)
def composed_epsilon(epsilon: float, delta: float, rounds: int) -> float:
    """ε at ``delta`` after ``rounds`` Gaussian mechanisms each calibrated to (ε, δ) (PLD).

    The noise multiplier σ/clip_norm is what composes; it does not depend on ``clip_norm``.
    """
    import dp_accounting  # imported here: only DP runs pay for it

    accountant = dp_accounting.pld.PLDAccountant()
    event = dp_accounting.GaussianDpEvent(gaussian_sigma(epsilon, delta))
    accountant.compose(event, rounds)
    return float(accountant.get_epsilon(delta))


def round_report(dp: DPParams, rounds: int) -> dict[str, float]:
    """Rounds-table columns: per-round (ε, δ), the noise std, and ε composed so far."""
    return {
        "dp_epsilon_round": dp.epsilon,
        "dp_delta": dp.delta,
        "dp_sigma": dp.sigma,
        "dp_epsilon_composed": composed_epsilon(dp.epsilon, dp.delta, rounds),
    }
