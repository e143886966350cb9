"""HDC-FL ("HDC-FL: Head-Derived Clustering for Personalized Federated Learning"): group clients by
their private heads, personalize with a soft mixture of per-group encoder prototypes, and leave the
FedAvg-SE trajectory untouched.

Training is FedAvg-SE (``raylf.methods.fedavg_se``); participants also upload their head to the
server's head cache (N × head size; heads are never averaged or forwarded). Each client keeps its
latest trained encoder φ_k itself. At a refresh (round T_a, every P rounds after it, and after the
last round) the server groups the cached heads (low-rank descriptors, k-means, softmax memberships
π_k), sends each cached client its π_k, and every such client reports ``soft_share(φ_k, π_k·n_k)``:
the workers reduce the G prototypes P_g = Σ π_kg n_k φ_k / Σ π_kg n_k, so the server never holds
N encoders. Client k is then evaluated with (Σ_g π_kg P_g, h_k); clients never cached, and
everyone before activation, with (φ, h_k).
"""

from __future__ import annotations

import json
from typing import Literal

import numpy as np
import torch
from pydantic import Field
from threadpoolctl import threadpool_limits

from raylf.methods.base import (
    ClientUpdate,
    Deployment,
    FitPlan,
    Method,
    MethodParams,
    Phase,
    register,
    soft_share,
)
from raylf.seeding import stream


class HDCFLParams(MethodParams):
    """Defaults: rank 8 (the paper's Table 10), τ 0.1, refresh every 5 rounds, activation at
    20 % of the rounds, low-rank descriptors, soft membership, current heads. G = 4 is the
    paper's controlled setting (Table 3, four rotation conditions); the paper gives no other.
    ``groups: 0`` ("no prototype") is FedAvg-SE, ``groups: 1`` one prototype (Table 3)."""

    rank: int = Field(8, ge=1, description="descriptor rank r (capped at the cached clients and "
                                           "the head size)")
    groups: int = Field(4, ge=0, description="k-means groups G; 0 = no prototype (FedAvg-SE)")
    temperature: float = Field(0.1, gt=0, description="τ of π_kg = softmax(−‖z_k − μ_g‖² / τ)")
    refresh_every: int = Field(5, ge=1, description="refresh period P in rounds")
    activation: int | None = Field(
        None, ge=1, description="first refresh round T_a; none = 20 % of federation.rounds")
    descriptor: Literal["lowrank", "raw"] = Field(
        "lowrank", description="lowrank: top-r SVD scores of the centered heads; raw: the "
                               "centered heads themselves (the paper's Table 10); both "
                               "L2-normalized")
    membership: Literal["soft", "hard"] = Field(
        "soft", description="soft: softmax memberships; hard: one-hot k-means labels (Table 12)")
    head_pairing: Literal["current", "cached"] = Field(
        "current", description="head paired with the mixture: the client's latest, or the one "
                               "it had at the last refresh")
    kmeans_restarts: int = Field(10, ge=1, description="k-means++ restarts (n_init)")


def top_scores(x: torch.Tensor, rank: int) -> torch.Tensor:
    """The truncated-SVD scores U_r Σ_r of ``x`` (K × D) from the eigenvectors of the smaller
    Gram matrix, K × K or D × D: at 1,000 clients × 51,300 head entries this is a K² product
    and one symmetric eigensolve instead of a full SVD."""
    k, d = x.shape
    r = min(rank, k, d)
    if k <= d:
        eigenvalues, u = torch.linalg.eigh(x @ x.T)  # ascending
        return u[:, -r:].flip(1) * eigenvalues[-r:].flip(0).clamp_min(0).sqrt()
    _, v = torch.linalg.eigh(x.T @ x)
    return x @ v[:, -r:].flip(1)


def head_descriptors(heads: torch.Tensor, rank: int | None) -> np.ndarray:
    """L2-normalized client descriptors from stacked flat heads (K × C·d): centered across
    clients, then the top-``rank`` truncated-SVD scores, or left raw with ``rank`` None. A zero
    row (a client at the mean) stays zero."""
    x = heads.double() - heads.double().mean(0, keepdim=True)
    if rank is not None:
        x = top_scores(x, rank)
    norms = x.norm(dim=1, keepdim=True)
    return (x / torch.where(norms > 0, norms, torch.ones_like(norms))).numpy()


def entropy(pi: np.ndarray) -> float:
    """Mean membership entropy in nats over clients (0 for one-hot rows)."""
    return float(np.mean(-np.sum(pi * np.log(np.where(pi > 0, pi, 1.0)), axis=1)))


def memberships(z: np.ndarray, centers: np.ndarray, labels: np.ndarray, temperature: float,
                soft: bool) -> np.ndarray:
    """π (K × G): softmax over groups of −‖z_k − μ_g‖² / τ, or one-hot of the labels."""
    if not soft:
        return np.eye(len(centers))[labels]
    logits = -((z[:, None, :] - centers[None]) ** 2).sum(-1) / temperature
    logits -= logits.max(1, keepdims=True)
    weights = np.exp(logits)
    return weights / weights.sum(1, keepdims=True)


@register
class HDCFL(Method):
    name = "hdcfl"
    Params = HDCFLParams
    proposed_in = "HDC-FL: Head-Derived Clustering for Personalized Federated Learning"
    personal_state = True
    averaged = frozenset({"encoder"})
    deployables = ("mixture", "shared")
    gain_over = "shared"  # acc_gain_mean: the personalization gain, acc_mean − acc_mean_shared

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.activation = params.activation or max(1, round(0.2 * ctx.rounds))

    # ---- server half ---------------------------------------------------------------------
    def server_init(self, init):
        layout, n = self.ctx.layout, self.ctx.num_clients
        return {"encoder": init[layout.part("encoder")].clone(),
                "heads": torch.zeros(n, layout.part_size("head")),
                "seen": torch.zeros(n, dtype=torch.bool),
                "assignment": torch.full((n,), -1, dtype=torch.int64),
                "membership": torch.zeros(n, 0),
                "prototypes": torch.zeros(0, layout.part_size("encoder"))}

    def broadcast(self, state, rnd):
        """The shared φ; after the first refresh also the prototypes (for the mixtures)."""
        if len(state["prototypes"]):
            return {"encoder": state["encoder"], "prototypes": state["prototypes"]}
        return {"encoder": state["encoder"]}

    def refreshes(self, state, rnd: int) -> bool:
        if self.params.groups == 0 or rnd < self.activation or not bool(state["seen"].any()):
            return False
        return (rnd - self.activation) % self.params.refresh_every == 0 or rnd == self.ctx.rounds

    def extras(self, state, client_ids, rnd):
        """Each grouped client's memberships π_k (G floats): next to the broadcast, and to the
        refresh's request."""
        grouped = state["assignment"] >= 0
        return {int(c): state["membership"][int(c)] for c in client_ids if bool(grouped[int(c)])}

    def aggregate(self, state, uploads, rnd):
        state = {**state, "encoder": uploads.mean("encoder")}
        if "head" in uploads:
            senders = torch.as_tensor(uploads.senders["head"])
            state["heads"] = state["heads"].clone()
            state["heads"][senders] = uploads.tensors["head"]
            state["seen"] = state["seen"].clone()
            state["seen"][senders] = True
        if not self.refreshes(state, rnd):
            return state, {}
        return self.regroup(state, rnd)

    def regroup(self, state, rnd):
        """Descriptors → k-means → memberships of the cached clients, with diagnostics."""
        # here, not at the top: scikit-learn costs every worker process ~2 s of start-up
        from sklearn.cluster import KMeans
        from sklearn.metrics import adjusted_rand_score, silhouette_score

        p = self.params
        cached = torch.nonzero(state["seen"]).flatten()
        z = head_descriptors(state["heads"][cached], p.rank if p.descriptor == "lowrank" else None)
        groups = min(p.groups, len(cached))
        seed = int(stream(self.ctx.seed, "method", rnd).integers(2**31 - 1))
        with threadpool_limits(1):  # the same clustering whatever threads the coordinator has
            km = KMeans(groups, init="k-means++", n_init=p.kmeans_restarts,
                        random_state=seed).fit(z)
        labels = km.labels_.astype(np.int64)
        pi = memberships(z, km.cluster_centers_, labels, p.temperature, p.membership == "soft")
        previous = state["assignment"][cached].numpy()
        n = self.ctx.num_clients
        state = {**state, "assignment": torch.full((n,), -1, dtype=torch.int64),
                 "membership": torch.zeros(n, groups)}
        state["assignment"][cached] = torch.from_numpy(labels)
        state["membership"][cached] = torch.from_numpy(pi).float()
        # groups_used: groups that are some cached client's strongest membership; 1 means the
        # grouping collapsed (every client leans on the same prototype)
        diagnostics = {"cached_clients": float(len(cached)), "membership_entropy": entropy(pi),
                       "groups_used": float(len(np.unique(pi.argmax(1))))}
        if 1 < len(np.unique(labels)) < len(labels):
            diagnostics["silhouette"] = float(silhouette_score(z, labels))
        both = previous >= 0
        if both.any():
            diagnostics["ari_previous"] = float(adjusted_rand_score(previous[both], labels[both]))
        if self.ctx.latent_groups is not None:
            latent = self.ctx.latent_groups[cached.numpy()]
            diagnostics["ari_latent"] = float(adjusted_rand_score(latent, labels))
        return state, diagnostics

    def phases(self):
        """At a refresh, after training, every client shares its encoder with the groups."""
        return (Phase("refresh", request=self.refresh, answer=self.share_encoder,
                      receive=self.set_prototypes, messages=self.extras),)

    def refresh(self, state, rnd):
        """At a refresh, an empty request: each grouped client's π_k travels as its message."""
        return {} if self.refreshes(state, rnd) else None

    def set_prototypes(self, state, uploads, rnd):
        """P_g from the reduced shares; a group nobody weighs (hard, empty) falls back to φ."""
        groups = state["membership"].shape[1]
        prototypes = [uploads.mean("encoder", g) if uploads.weight("encoder", g) > 0
                      else state["encoder"] for g in range(groups)]
        return {**state, "prototypes": torch.stack(prototypes)}, {}

    # ---- client half ---------------------------------------------------------------------
    def client_init(self, cid, init):
        """The private head; ``encoder`` (φ_k) stays empty until the client first trains."""
        return {"encoder": torch.zeros(0), "head": init[self.ctx.layout.part("head")].clone()}

    def plan(self, client):
        """FedAvg-SE's update; the head also goes to the server's cache (unless G = 0)."""
        parts, personal = self.ctx.layout.parts, client.personal

        def finish(trained):
            encoder, head = trained[parts["encoder"]].clone(), trained[parts["head"]].clone()
            upload = {"encoder": encoder, "head": head} if self.params.groups else \
                {"encoder": encoder}
            return ClientUpdate(upload, {**personal, "encoder": encoder, "head": head})

        return FitPlan(torch.cat([client.payload["encoder"], personal["head"]]), finish)

    def share_encoder(self, client):
        """φ_k into every group g with weight π_kg·n_k (nothing from a client not grouped)."""
        personal = client.personal
        if client.extra is None:
            return ClientUpdate({}, personal)
        if self.params.head_pairing == "cached":
            personal = {**personal, "paired": personal["head"]}
        return ClientUpdate({"encoder": soft_share(personal["encoder"],
                                                   client.extra * client.data.n_train)},
                            personal)

    def deploy(self, client):
        """(Σ_g π_kg P_g, h_k) for a grouped client once prototypes exist, else the shared
        encoder (φ, h_k), and (φ, h_k) itself; the mixture's rows name the strongest group and
        the memberships. The rounds table's ``acc_gain_mean`` is the personalization gain,
        acc_mean − acc_mean_shared (``gain_over``)."""
        payload, personal, extra = client.payload, client.personal, client.extra
        shared = torch.cat([payload["encoder"], personal["head"]])
        if extra is None or "prototypes" not in payload:
            return Deployment({"mixture": shared, "shared": shared},
                              {"mixture": {"cluster": None, "mixture": None}})
        prototypes = payload["prototypes"]
        mixture = extra.to(prototypes.device, prototypes.dtype) @ prototypes
        weights = extra.tolist()
        return Deployment(
            {"mixture": torch.cat([mixture, personal.get("paired", personal["head"])]),
             "shared": shared},
            {"mixture": {"cluster": int(np.argmax(weights)),
                         "mixture": json.dumps([round(w, 6) for w in weights])}})
