"""FC, Federated Clustering (Werner et al., TMLR 2023, "Provably Personalized and Robust Federated
Learning"): every client keeps its own model x_i and steps with a robust cluster-local mean of the
gradients of x_i on every peer's batch.

The per-client ("myopic") variant, on the per-step runtime of ``raylf.methods.perstep``: each step
every client j computes g_ij = ∇f_j(x_i) at every model x_i of its group (one vectorized call);
the server runs Threshold-Clustering TC({g_ij}_j, start g_ii) per model i (T iterations, radius =
the ⌊q·n⌋-th smallest distance to the current centre, points beyond it replaced by the centre),
and client i applies its optimizer to the clustered estimate (momentum on the clustered estimate,
as in the author code). With ``groups`` > 1 the clients are split at random
each step (seeded by trial and step) and cluster only within their group, cutting the n²
gradients per step to about n²/groups; a client of a smaller group pads its upload with zero rows
to the largest group's size.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from pydantic import Field

from raylf.methods.base import MethodParams, register
from raylf.methods.perstep import PeerStepMethod
from raylf.seeding import stream


class FCParams(MethodParams):
    """Defaults from the author code (quantile radius q = 0.2, T = 3); groups 1 (every
    peer in one group) suits the federations of tens of clients SP-CACW's paper uses."""

    groups: int = Field(1, ge=1, description="random client groups per step; clustering runs "
                                             "within each (author code: num_groups)")
    iterations: int = Field(3, ge=1, description="Threshold-Clustering iterations T")
    quantile: float = Field(0.2, ge=0, le=1, description="radius = this quantile of the "
                                                         "distances to the centre (⌊q·n⌋-th)")


def threshold_clustering(points: torch.Tensor, start: torch.Tensor, iterations: int,
                         quantile: float) -> tuple[torch.Tensor, torch.Tensor]:
    """TC for a batch of problems: ``points`` (B, n, P), ``start`` (B, P) → (centres (B, P),
    how many points the last radius kept (B,)). Each iteration keeps the points within the
    ⌊q·n⌋-th smallest distance and averages them with the centre standing in for the others."""
    n = points.shape[1]
    rank = min(n - 1, math.floor(quantile * n))
    v = start
    kept = torch.zeros(len(points))
    for _ in range(iterations):
        d = (points - v[:, None]).norm(dim=-1)
        radius = d.sort(dim=1).values[:, rank]
        keep = d <= radius[:, None]
        v = torch.where(keep[..., None], points, v[:, None]).mean(1)
        kept = keep.sum(1).double()
    return v, kept


def partition(seed: int, rnd: int, n: int, groups: int) -> list[np.ndarray]:
    """Step ``rnd``'s client groups (sorted ids), the same in both halves."""
    if groups == 1:
        return [np.arange(n)]
    order = stream(seed, "method", rnd).permutation(n)
    return [np.sort(g) for g in np.array_split(order, groups)]


@register
class FC(PeerStepMethod):
    name = "fc"
    Params = FCParams

    @classmethod
    def check(cls, spec, params):
        problems = super().check(spec, params)
        groups, clients = params.groups, spec.federation.num_clients
        if groups > clients:
            problems.append(("method.params.groups", (
                f"groups={groups} exceeds the {clients} clients; use at most "
                "federation.num_clients")))
        return problems

    def learner_ids(self):
        return np.arange(self.ctx.num_clients)

    @property
    def upload_width(self) -> int:
        return math.ceil(self.ctx.num_clients / self.params.groups)

    def groups(self, rnd: int) -> list[np.ndarray]:
        return partition(self.ctx.seed, rnd, self.ctx.num_clients, self.params.groups)

    def rows_for(self, cid, rnd):
        return torch.as_tensor(next(g for g in self.groups(rnd) if cid in g))

    def directions(self, state, grads, rnd):
        directions = torch.empty(grads.shape[0], grads.shape[2], dtype=grads.dtype)
        kept = torch.zeros(grads.shape[0], dtype=torch.float64)
        p = self.params
        for members in self.groups(rnd):
            idx = torch.as_tensor(members)
            s = len(members)
            points = grads[idx, :s].transpose(0, 1)  # (model b, client a, P) = ∇f_{m_a}(x_{m_b})
            start = points[torch.arange(s), torch.arange(s)]
            directions[idx], kept[idx] = threshold_clustering(points, start, p.iterations,
                                                              p.quantile)
        return state, directions, {"fc_kept_mean": float(kept.mean())}
