"""Differential privacy of each client's uploads: clipping, the Gaussian mechanism, accounting.

What is protected. Each client clips the vector it uploads to L2 norm ≤ ``clip_norm`` and adds
N(0, σ²I) before it leaves the client; the server sees every upload on its own, so this is local
DP per upload. Neighbouring datasets are *replace-one*: the same client holding different data.
Two clipped uploads can then lie anywhere in the ball of radius ``clip_norm``, so the L2
sensitivity of one upload is 2·clip_norm (clip_norm is the sensitivity of a *sum* when one
client is added or removed, which does not apply to an upload the server sees on its own).

Calibration (``DPParams.calibration``):

- ``analytic`` (default): the analytic Gaussian mechanism of Balle & Wang (2018), from
  ``dp_accounting.get_sigma_gaussian``, at sensitivity 2·clip_norm. It is exact for every ε:
  each round is (ε, δ)-DP and no more noise is added than that needs (σ ≈ 7.46 at ε 1, δ 1e-5,
  clip 1).
- ``paper``: the classical σ = clip_norm·sqrt(2 ln(1.25/δ))/ε the FMT-SVM paper uses. Its proof
  (Dwork & Roth, Thm A.1) holds only for ε < 1; beyond it there is no guarantee, and for large ε
  it under-noises (at δ 1e-5 from ε ≈ 10). At the paper's ε = 1 the larger flaw is the
  sensitivity: σ = 4.845 at the true sensitivity 2·clip_norm only achieves ε ≈ 1.61 per round,
  which ``dp_epsilon_achieved`` reports.

Accounting. ``dp_epsilon_achieved`` is the per-round ε at δ that σ gives at the true sensitivity
(the exact Gaussian-mechanism ε from dp-accounting). ``dp_epsilon_composed`` after R rounds is
the ε at the same δ of all R uploads of one client, composed with dp-accounting's
privacy-loss-distribution (PLD) accountant (tight for repeated Gaussian mechanisms; RDP would
overstate it by ~10 %). It assumes the client took part in every round, so it is an upper bound
for a client that skipped some.

Scale warning: σ ≈ 7.46·clip_norm at ε 1, so the noise on a d-dimensional upload has about
7.46·sqrt(d) times the norm of the clipped vector (≈ 170× for 516 head weights). A model averaged
from a handful of noisy uploads is near chance; only many clients (the noise std of the average
falls as 1/sqrt(K)) average it down.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

Calibration = Literal["analytic", "paper"]


class DPParams(BaseModel):
    """Gaussian mechanism on each upload; off when ``epsilon`` is null."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # finite numbers only

    epsilon: float | None = Field(
        None, gt=0, description="requested per-round ε of each upload; null = no DP")
    delta: float = Field(1e-5, gt=0, lt=1, description="δ of every (ε, δ) figure reported")
    clip_norm: float = Field(
        1.0, gt=0, description="L2 bound the upload is clipped to; sensitivity is twice this")
    calibration: Calibration = Field(
        "analytic",
        description="analytic: exact analytic Gaussian mechanism at sensitivity 2·clip_norm; "
                    "paper: classical formula at sensitivity clip_norm (under-noised, see "
                    "dp_epsilon_achieved)")

    @property
    def enabled(self) -> bool:
        return self.epsilon is not None

    @property
    def sensitivity(self) -> float:
        return replace_one_sensitivity(self.clip_norm)

    @property
    def sigma(self) -> float:
        return gaussian_sigma(self.epsilon, self.delta, self.clip_norm, self.calibration)

    @property
    def noise_multiplier(self) -> float:
        """σ over the true sensitivity: the one number the accountant needs."""
        return self.sigma / self.sensitivity


def replace_one_sensitivity(clip_norm: float) -> float:
    """L2 distance of two uploads clipped to ``clip_norm``: the diameter of the ball."""
    return 2.0 * clip_norm


@lru_cache(maxsize=256)
def _analytic_noise_multiplier(epsilon: float, delta: float) -> float:
    import dp_accounting  # imported here: only DP runs pay for it

    return float(dp_accounting.get_sigma_gaussian(epsilon, delta))


def gaussian_sigma(epsilon: float, delta: float, clip_norm: float = 1.0,
                   calibration: Calibration = "analytic") -> float:
    """Noise std per coordinate for a requested per-round (ε, δ) under ``calibration``."""
    if calibration == "paper":
        return clip_norm * math.sqrt(2 * math.log(1.25 / delta)) / epsilon
    return replace_one_sensitivity(clip_norm) * _analytic_noise_multiplier(epsilon, delta)


@lru_cache(maxsize=256)
def achieved_epsilon(noise_multiplier: float, delta: float) -> float:
    """Exact per-round ε at ``delta`` of one Gaussian mechanism with std/sensitivity given."""
    import dp_accounting

    return float(dp_accounting.get_epsilon_gaussian(noise_multiplier, delta))


@lru_cache(maxsize=256)
def composed_epsilon(noise_multiplier: float, delta: float, rounds: int) -> float:
    """ε at ``delta`` of ``rounds`` Gaussian mechanisms of std/sensitivity given (PLD)."""
    import dp_accounting

    accountant = dp_accounting.pld.PLDAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier), rounds)
    return float(accountant.get_epsilon(delta))


def clip(vector: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """Scale ``vector`` down to L2 norm ``clip_norm`` if it is longer (never scaled up)."""
    norm = float(vector.norm())
    return vector * (clip_norm / norm) if norm > clip_norm else vector.clone()


def privatize(vector: torch.Tensor, dp: DPParams, seed: int) -> torch.Tensor:
    """Clip, then add N(0, σ²I) drawn from a generator seeded by ``seed`` (reproducible)."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(vector.shape, generator=gen, dtype=vector.dtype) * dp.sigma
    return clip(vector, dp.clip_norm) + noise.to(vector.device)


def round_accounting(dp: DPParams, rounds: int) -> dict[str, float]:
    """Rounds-table columns after ``rounds`` rounds: requested and achieved ε, σ, composed ε."""
    return {
        "dp_epsilon_round": dp.epsilon,
        "dp_delta": dp.delta,
        "dp_sigma": dp.sigma,
        "dp_sensitivity": dp.sensitivity,
        "dp_epsilon_achieved": achieved_epsilon(dp.noise_multiplier, dp.delta),
        "dp_epsilon_composed": composed_epsilon(dp.noise_multiplier, dp.delta, rounds),
    }
