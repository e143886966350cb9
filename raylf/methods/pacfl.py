"""PACFL (Vahidian, Morafah et al., AAAI 2023, "Efficient Distribution Similarity Identification in
Clustered Federated Learning via Principal Angles between Client Data Subspaces"): one-shot
clustering by the angles between the clients' data subspaces, then FedAvg inside each cluster.

Setup (round 0): each client sends U_k, the top-p left singular vectors of every class's raw
flattened training inputs (not mean-centered), as d × (p·C) columns in class order: a class the
client lacks, or one with fewer than p samples, leaves zero columns, so every upload has one
shape and the server receives them stacked. The server measures the distance between every pair
of clients, clusters them agglomeratively with distance threshold β, and from then on runs one
FedAvg per cluster: a participant receives its cluster's model and cluster id (a per-client
extra, so bytes down count one model per client, not every cluster's), and uploads a share in
its cluster's group.

Distances (``distance``):
- ``principal`` (default, the paper): the smallest principal angle between span(U_i) and
  span(U_j), arccos σ_max(Q_iᵀQ_j) with Q an orthonormal basis of the span, in radians. Zero
  columns span nothing, so they change neither Q nor the angle.
- ``entrywise``: the authors' code, min over column pairs of arccos(u_aᵀu_b) in degrees (not the
  principal angle: it ignores sign flips and combinations of columns). Zero columns are left out
  of the minimum: they would otherwise give 90° to every pair.
An absolute threshold is in the distance's unit: the paper's 1.5 radians; the authors' scripts
use 3.5 to 4.9 degrees with ``entrywise``.

Decision — linkage ``average`` is UPGMA (scipy's and scikit-learn's average, the size-weighted
mean); the authors' code merges by the plain mean of the two rows, WPGMA, which is ``weighted``.
Every cluster model starts from the common init.

Decision — the threshold's scale (``threshold_scale``, default ``relative``): the paper's
β = 1.5 rad is absolute, but how far apart the clients' subspaces lie depends on the inputs
(raw images share their mean direction, so smallest principal angles are small) and on the
distance (radians, or the authors' degrees). Relative: β = threshold × the median over clients
of the distance to its nearest other client, the spread of subspaces drawn from one
distribution, so clients merge while they are about as close as such neighbours and split
where the distances jump. The same number works in radians and degrees, at any input size.
``threshold_scale: absolute`` with ``threshold: 1.5`` is the paper's setting; a run where the
threshold merges every client logs a warning with β and the largest distance, and the rounds
table's ``clusters`` (1 = PACFL is FedAvg) shows it.

Chosen on validation data, never test (final-round ``val_acc_mean``, in brackets the clusters
found): the MNIST-sized stand-in digits28, 20 clients, half of them per round, MLP 784-64-10,
SGD lr 0.05 momentum 0.9, batch 32, E 1, R 15, val_fraction 0.1, seed 0; the HDC-FL paper's
kinds of shift (its Table 1): two and three classes per client (LS2, LS3), four rotation groups.

    threshold            LS2          rotation     LS3          mean
    absolute 1.5 rad     0.447 (1)    0.549 (1)    0.737 (1)    0.578
    relative 1.25        0.771 (11)   0.798 (4)    0.666 (9)    0.745
    relative 1.5         0.628 (7)    0.627 (2)    0.602 (5)    0.619
    relative 2           0.628 (7)    0.627 (2)    0.521 (4)    0.592
    relative 3           0.569 (6)    0.627 (2)    0.737 (1)    0.644

The paper's 1.5 rad puts all 20 clients in one cluster in every setting (the largest
smallest principal angle between two clients there is 0.1–0.5 rad): PACFL is then FedAvg, with
identical figures. Relative 1.25 has the best mean and the best worst case; on rotation it
finds 4 clusters (on seed 3's partition exactly the four groups, ARI 1.0; from 1.5 on, the 0°
and 180° groups, whose subspaces lie closer, merge). The authors' entrywise 3.5° leaves 17–20
of 20 clients alone on the same data (near-local training).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from raylf.methods.base import Method, MethodParams, register
from raylf.methods.shared import (
    group_deployment,
    group_extras,
    group_means,
    group_plan,
    group_state,
)

log = logging.getLogger(__name__)


class PACFLParams(MethodParams):
    """Defaults: the HDC-FL paper's Table 5 (p = 3, average linkage, one-shot); the threshold 1.25 ×
    the clients' median nearest-neighbour distance, chosen on validation data (module
    docstring: the paper's 1.5 rad merges every client on raw images and makes PACFL FedAvg);
    the paper's is ``threshold_scale: absolute, threshold: 1.5``."""

    basis: int = Field(3, ge=1, description="p, left singular vectors kept per class")
    threshold: float = Field(1.25, gt=0, description="β: clusters closer than this merge "
                                                    "(relative: a multiple of the median "
                                                    "nearest-neighbour distance; absolute: "
                                                    "radians for principal, degrees for "
                                                    "entrywise)")
    threshold_scale: Literal["relative", "absolute"] = Field(
        "relative", description="relative: β = threshold × the median over clients of the "
                                "distance to the nearest other client (scale-free); absolute: "
                                "β = threshold in the distance's unit (the paper's 1.5 rad)")
    distance: Literal["principal", "entrywise"] = Field(
        "principal", description="principal: smallest principal angle (paper); entrywise: the "
                                 "authors' min arccos over column pairs, in degrees")
    linkage: Literal["average", "weighted", "complete", "single"] = Field(
        "average", description="agglomerative linkage: average = UPGMA, weighted = WPGMA (the "
                               "authors' 'average'), complete, single")


def class_bases(x: torch.Tensor, y: torch.Tensor, num_classes: int, p: int) -> torch.Tensor:
    """d × (p·C): per class, the top-p left singular vectors of its flattened inputs as columns;
    zero columns where a class has fewer than p samples or none."""
    flat = x.reshape(len(x), -1).double()
    out = torch.zeros(flat.shape[1], p * num_classes, dtype=torch.float64, device=x.device)
    for c in range(num_classes):
        rows = flat[y == c]
        if len(rows):
            u = torch.linalg.svd(rows.T, full_matrices=False).U[:, :p]
            out[:, c * p: c * p + u.shape[1]] = u
    return out.float()


def orthonormal_spans(bases: torch.Tensor, tol: float = 1e-6) -> torch.Tensor:
    """(N, d, r) orthonormal bases of each client's column span, zero-padded to the largest rank
    r: the left singular vectors of nonzero singular value."""
    u, s, _ = torch.linalg.svd(bases.double(), full_matrices=False)
    keep = s > tol * s[:, :1].clamp_min(tol)
    u = u * keep[:, None, :]
    rank = int(keep.sum(1).max())
    return u[:, :, :rank]


def pairwise(bases: torch.Tensor, reduce: Callable[[torch.Tensor, slice, slice], torch.Tensor],
             chunk: int = 128) -> torch.Tensor:
    """Symmetric N × N ``reduce(gram, rows, cols)`` of the column inner products of two
    clients' bases (N, d, r); ``gram`` (m, n, r, r) holds clients ``rows`` against ``cols``.
    Built in blocks of the upper triangle (each pair once), so memory stays chunk²·r²."""
    n, d, r = bases.shape
    flat = bases.permute(1, 0, 2).reshape(d, n * r)
    out = torch.zeros(n, n, dtype=torch.float64)
    for start in range(0, n, chunk):
        rows = slice(start, min(n, start + chunk))
        left = flat[:, rows.start * r: rows.stop * r].T
        for begin in range(start, n, chunk):
            cols = slice(begin, min(n, begin + chunk))
            gram = (left @ flat[:, cols.start * r: cols.stop * r]).reshape(
                rows.stop - rows.start, r, cols.stop - cols.start, r).transpose(1, 2)
            block = reduce(gram, rows, cols)
            out[rows, cols] = block
            out[cols, rows] = block.T
    return out.fill_diagonal_(0)


def principal_distances(bases: torch.Tensor) -> torch.Tensor:
    """N × N smallest principal angles (radians) between the clients' spans: arccos of the
    largest singular value of Q_iᵀQ_j for orthonormal bases Q (zero padding adds zero singular
    values only), from the largest eigenvalue of the r × r matrix (Q_iᵀQ_j)ᵀ(Q_iᵀQ_j)."""
    def reduce(gram, rows, cols):
        top = torch.linalg.eigvalsh(gram.transpose(-1, -2) @ gram)[..., -1]
        return torch.arccos(top.clamp(0, 1).sqrt())

    return pairwise(orthonormal_spans(bases), reduce)


def entrywise_distances(bases: torch.Tensor) -> torch.Tensor:
    """N × N min over nonzero column pairs of arccos(u_aᵀu_b), in degrees (the authors' code):
    arccos of the largest inner product, arccos being decreasing."""
    valid = bases.norm(dim=1) > 0  # (N, r)
    order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
    width = int(valid.sum(1).max())  # each client's nonzero columns first, the rest cut
    order = order[:, :width]
    b = bases.double().gather(2, order[:, None, :].expand(-1, bases.shape[1], -1))
    valid = valid.gather(1, order)

    def reduce(gram, rows, cols):
        pairs = valid[rows, None, :, None] & valid[None, cols, None, :]
        top = gram.masked_fill(~pairs, -torch.inf).amax((2, 3))
        return torch.rad2deg(torch.arccos(top.clamp(-1, 1)))

    return pairwise(b, reduce)


def cluster(distances: np.ndarray, threshold: float, linkage: str) -> np.ndarray:
    """Cluster ids 0..G−1: agglomerative merging while the closest pair is within the threshold."""
    from scipy.cluster.hierarchy import fcluster
    from scipy.cluster.hierarchy import linkage as hierarchy
    from scipy.spatial.distance import squareform

    if len(distances) == 1:
        return np.zeros(1, dtype=np.int64)
    tree = hierarchy(squareform(distances, checks=False), method=linkage)
    return fcluster(tree, t=threshold, criterion="distance").astype(np.int64) - 1


def nearest_neighbour_scale(distances: np.ndarray) -> float:
    """The median over clients of the distance to the nearest other client."""
    others = distances + np.diag(np.full(len(distances), np.inf))
    return float(np.median(others.min(1)))


def merge_threshold(distances: np.ndarray, params: PACFLParams) -> float:
    """β in the distance's unit."""
    if params.threshold_scale == "absolute" or len(distances) < 2:
        return params.threshold
    return params.threshold * nearest_neighbour_scale(distances)


def one_cluster_warning(distances: np.ndarray, beta: float, params: PACFLParams) -> str:
    """Why a PACFL run is FedAvg: β is above every pairwise distance (the paper's absolute 1.5
    radians does this on raw inputs, whose subspaces share the mean direction)."""
    unit = "rad" if params.distance == "principal" else "degrees"
    far = float(distances.max())
    fix = ("lower method.params.threshold" if params.threshold_scale == "relative" else
           f"set method.params.threshold below {far:.3g} or threshold_scale: relative")
    return (f"pacfl: the merge threshold β = {beta:.3g} {unit} (threshold {params.threshold}, "
            f"{params.threshold_scale}) is above every pairwise distance (largest {far:.3g} "
            f"{unit}), so all {len(distances)} clients form one cluster and PACFL runs as "
            f"FedAvg; to separate clients {fix}")


@register
class PACFL(Method):
    name = "pacfl"
    Params = PACFLParams

    def server_init(self, init):
        """One cluster of everyone until the setup phase has clustered the clients."""
        return {"init": init.clone()} | group_state(
            init, torch.zeros(self.ctx.num_clients, dtype=torch.int64))

    def setup(self, client):
        return {"basis": class_bases(client.data.x_train, client.data.y_train,
                                     self.ctx.num_classes, self.params.basis)}

    def server_setup(self, state, uploads):
        bases = uploads.tensors["basis"]
        measure = principal_distances if self.params.distance == "principal" \
            else entrywise_distances
        distances = measure(bases).numpy()
        beta = merge_threshold(distances, self.params)
        ids = torch.as_tensor(cluster(distances, beta, self.params.linkage))
        if len(distances) > 1 and int(ids.max()) == 0:
            log.warning(one_cluster_warning(distances, beta, self.params))
        return state | group_state(state["init"], ids)

    def broadcast(self, state, rnd):
        return {}

    def extras(self, state, client_ids, rnd):
        return group_extras(state, client_ids)

    def aggregate(self, state, uploads, rnd):
        models = group_means(state["models"], uploads)
        return state | {"models": models}, {"clusters": float(len(models))}

    def plan(self, client):
        return group_plan(client)

    def deploy(self, client):
        return group_deployment(client)
