"""SP-CACW's weight solver (the SP-CACW paper's section 4.3 and appendix F.1): the accumulated
quadratic proxy with its cubic regularizer, minimized over the probability simplex by projected
gradient descent.

NumPy float64, batched over the targets that update together: the vectors are M ≤ a few
hundred long and the solver runs thousands of tiny steps, so one step for all targets at once
costs what one target's would (a step of a single target run alone is ~100 µs of overhead)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection of each row of ``v`` (…, M) onto {α ≥ 0, Σα = 1}, by sorting
    (Held et al. 1974; Duchi et al. 2008): α = max(v − θ, 0) with θ from the largest ρ whose
    sorted entry stays positive after the shift."""
    u = -np.sort(-v, axis=-1)
    shifted = (np.cumsum(u, axis=-1) - 1) / np.arange(1, v.shape[-1] + 1)
    rho = (u > shifted).sum(-1, keepdims=True) - 1  # the condition holds on a prefix
    return np.maximum(v - np.take_along_axis(shifted, rho, -1), 0)


def objective(alpha: np.ndarray, q: np.ndarray, lam: float) -> float:
    """J(α) = αᵀQα + λ·Σα³ (Q already divided by the number of accumulated steps K)."""
    return float(alpha @ q @ alpha + lam * np.sum(alpha ** 3))


def objective_grad(alpha: np.ndarray, q: np.ndarray, lam) -> np.ndarray:
    """∇J = (Q + Qᵀ)α + 3λα², for one α (M,) or a batch (B, M) with Q (B, M, M), λ (B,)."""
    return _gradient(alpha, q + np.swapaxes(q, -1, -2), lam)


def _gradient(alpha: np.ndarray, sym: np.ndarray, lam) -> np.ndarray:
    """∇J given Q + Qᵀ (the solver forms it once)."""
    return (sym @ alpha[..., None])[..., 0] + 3 * np.asarray(lam)[..., None] * alpha ** 2


@dataclass(frozen=True)
class Solution:
    alpha: np.ndarray
    iterations: np.ndarray
    converged: np.ndarray


def minimize_on_simplex(q: np.ndarray, lam, start: np.ndarray, *, tol: float,
                        max_iter: int) -> Solution:
    """Projected gradient descent on J from ``start`` (the warm start: the current α) until the
    largest change of a weight in one step is below ``tol``; Q (M, M) or a batch (B, M, M)
    with λ and ``start`` to match, each problem stopping on its own.

    The step 1/(2·λ_max(Q) + 6λ) is the inverse of J's curvature bound on the simplex (the
    cubic's Hessian is 6λ·diag(α) ≤ 6λ), so every step decreases J. A fixed small iteration
    count does not converge late in training, when off-cluster peers make λ_max large.
    """
    single = q.ndim == 2
    q = q[None] if single else q
    lam = np.broadcast_to(np.asarray(lam, dtype=np.float64), (len(q),))
    alpha = np.array(start, dtype=np.float64).reshape(len(q), -1)
    sym = q + np.swapaxes(q, -1, -2)
    curvature = np.abs(np.linalg.eigvalsh(sym)).max(-1) + 6 * lam
    step = np.where(curvature > 0, 1 / np.where(curvature > 0, curvature, 1), 0)
    iterations = np.zeros(len(q), dtype=np.int64)
    active = curvature > 0
    for _ in range(max_iter):
        if not active.any():
            break
        idx = np.flatnonzero(active)
        a = alpha[idx]
        new = project_simplex(a - step[idx, None] * _gradient(a, sym[idx], lam[idx]))
        alpha[idx] = new
        iterations[idx] += 1
        active[idx] = np.abs(new - a).max(-1) >= tol
    converged = ~active
    if single:
        return Solution(alpha[0], iterations[0], converged[0])
    return Solution(alpha, iterations, converged)
