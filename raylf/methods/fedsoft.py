"""FedSoft (Ruan & Joe-Wong, AAAI 2022, "FedSoft: Soft Clustered Federated Learning with Proximal
Local Updating"): soft clustering with S cluster models and a persistent local model per client,
pulled towards every cluster by its importance weights.

- Importance estimation (every ``estimation_every`` rounds, by every client, in the round's
  ``estimate`` phase after training): for each training sample the cluster model with the lowest
  loss gets a count; u_ks = count_s / n_k, a zero count replaced by σ·n_k (no renormalization).
  The client keeps u_k; the server keeps the N × S matrix for selection and aggregation.
- Selection (``selection: true``): for each cluster s, K clients without replacement with
  probabilities v_sk = u_ks n_k / Σ_j u_js n_j; the union trains, a client chosen for several
  clusters once. ``false``: the federation's uniform participation.
- Local objective: f_k(w) + (λ/2) Σ_s u_ks ‖w − c_s‖², from the client's own previous model (the
  server never overwrites it). Its gradient is λ·U_k·(w − c̄_k) with U_k = Σ_s u_ks and c̄_k the
  u-weighted mean of the cluster models, so it runs as the trainer's ``prox`` with that anchor
  and strength: the same steps as the sum of S terms, in one.
- Aggregation through soft shares: with selection c_s ← the uniform mean of the clients chosen
  for s (the sampling already weighs by importance); without, c_s ← Σ_k v_sk w_k over the
  round's participants. A cluster no share reached keeps its model.
- Evaluation: the local model w_k (``local``); secondary ``cluster``: the cluster model of the
  largest importance weight. The clients table records u_k (``importance``).

Decision — the first round: u_k = 1/S until the first estimation, which runs after round
``estimation_every`` (the author estimates at the start of rounds 0, τ, 2τ… on the models of the
round before; only round 1 differs: it trains with uniform weights instead of an argmin over
random inits). No estimation after the last round (nothing trains on it).
Decision — the optimizer is the experiment's (SGD by default), not the author's Adam: raylf
fixes one local optimizer for every method of an experiment.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

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
from raylf.methods.shared import group_means
from raylf.seeding import stream


class FedSoftParams(MethodParams):
    """Defaults: the author code (ycruan/FedSoft ``solvers.py``: τ = 1, σ = 1e-4) and the paper's
    MNIST setting (λ = 0.1); S = 4 as IFCA's (the HDC-FL paper's Table 5). K defaults to the round's
    size split over the clusters, so the union trains at most as many clients as other methods'
    rounds (the author's 30 of 100 clients with S = 4 trains up to 120 samples of 100)."""

    clusters: int = Field(4, ge=1, le=64, description="S, the number of cluster models")
    lam: float = Field(0.1, ge=0, description="λ, strength of the proximal terms to the clusters")
    smoothing: float = Field(1e-4, gt=0, lt=1, description="σ: a cluster no sample chose counts "
                                                           "σ·n_k samples")
    estimation_every: int = Field(1, ge=1, description="τ: rounds between importance estimations")
    selection: bool = Field(True, description="sample K clients per cluster by importance "
                                              "(do_selection); false: uniform participation")
    per_cluster: int | None = Field(None, ge=1, description="K, clients sampled per cluster; "
                                                            "None: ⌈participants / S⌉")


def importance(losses: torch.Tensor, smoothing: float) -> torch.Tensor:
    """u_k from per-sample losses (S, n): the share of samples each cluster fits best, a zero
    share replaced by σ. Before smoothing the shares sum to 1."""
    clusters, n = losses.shape
    counts = torch.bincount(losses.argmin(0), minlength=clusters).double()
    shares = counts / max(n, 1)
    return torch.where(counts > 0, shares, torch.full_like(shares, smoothing))


def aggregation_weights(u: torch.Tensor, n_train: torch.Tensor) -> torch.Tensor:
    """v (S, N): v_sk = u_ks n_k / Σ_j u_js n_j, each cluster's row summing to 1."""
    mass = (u * n_train[:, None].to(u.dtype)).T
    return mass / mass.sum(1, keepdim=True)


@register
class FedSoft(Method):
    name = "fedsoft"
    Params = FedSoftParams
    personal_state = True
    deployables = ("local", "cluster")

    @property
    def k(self) -> int:
        per = self.params.per_cluster or math.ceil(
            self.ctx.participants_per_round / self.params.clusters)
        return min(per, self.ctx.num_clients)

    # ---- server half -------------------------------------------------------------------------
    def server_init(self, init):
        s = self.params.clusters
        return {"clusters": self.ctx.initial_models(s),
                "importance": torch.full((self.ctx.num_clients, s), 1.0 / s, dtype=torch.float64)}

    def chosen(self, state, rnd: int) -> torch.Tensor:
        """(S, K) client ids: each cluster's K draws by importance, from the round's own stream
        (broadcast and select rebuild the same draws, so neither mutates the state)."""
        v = aggregation_weights(state["importance"], torch.tensor(self.ctx.n_train)).numpy()
        rng = stream(self.ctx.seed, "method", rnd)
        return torch.as_tensor(np.stack([
            rng.choice(self.ctx.num_clients, self.k, replace=False, p=row / row.sum())
            for row in v]))

    def select(self, state, rnd, rng):
        if not self.params.selection:
            return super().select(state, rnd, rng)
        return np.unique(self.chosen(state, rnd).numpy())

    def broadcast(self, state, rnd):
        payload = {"clusters": state["clusters"]}
        if self.params.selection:
            payload["chosen"] = self.chosen(state, rnd)
        return payload

    def aggregate(self, state, uploads, rnd):
        return state | {"clusters": group_means(state["clusters"], uploads)}, {}

    def phases(self):
        """After training, every ``estimation_every`` rounds, every client estimates its
        importance weights on the new cluster models."""
        return (Phase("estimate", request=self.estimation, answer=self.estimate,
                      receive=self.new_importance),)

    def estimation(self, state, rnd):
        if rnd % self.params.estimation_every or rnd == self.ctx.rounds:
            return None
        return {"clusters": state["clusters"]}

    def new_importance(self, state, uploads, rnd):
        u = state["importance"].clone()
        u[torch.as_tensor(uploads.senders.get("importance", uploads.client_ids))] = \
            uploads.tensors["importance"]
        dominant = torch.bincount(u.argmax(1), minlength=self.params.clusters)
        return state | {"importance": u}, {"clusters_dominant": float((dominant > 0).sum())}

    # ---- client half -------------------------------------------------------------------------
    def client_init(self, cid, init):
        s = self.params.clusters
        return {"model": init.clone(),
                "importance": torch.full((s,), 1.0 / s, dtype=torch.float64)}

    def plan(self, client):
        """The local model's proximal fit towards c̄_k with strength λ·U_k (each client its own
        anchor and strength, so cohorts step clients of one strength together)."""
        personal, clusters = client.personal, client.payload["clusters"]
        u = personal["importance"].to(clusters.dtype)
        total = float(u.sum())
        anchor = (u / total) @ clusters
        if self.params.selection:
            weights = (client.payload["chosen"] == client.cid).any(1).double()
        else:
            weights = personal["importance"] * client.data.n_train

        def finish(model: torch.Tensor) -> ClientUpdate:
            return ClientUpdate({"model": soft_share(model, weights)}, personal | {"model": model})

        return FitPlan(personal["model"], finish, anchor=anchor, mu=self.params.lam * total)

    def estimate(self, client):
        """u_k from every cluster model's per-sample losses on the client's training data."""
        losses = []
        for cluster in client.payload["clusters"]:
            client.trainer.load(cluster)
            logits = client.trainer.predict(client.data.x_train)
            losses.append(F.cross_entropy(logits, client.data.y_train, reduction="none"))
        u = importance(torch.stack(losses), self.params.smoothing).cpu()
        return ClientUpdate({"importance": u}, client.personal | {"importance": u})

    def deploy(self, client):
        """The local model, and the cluster model of the largest importance weight; both rows
        carry the weights (``importance``)."""
        u = [float(w) for w in client.personal["importance"]]
        columns = {"importance": u}
        return Deployment({"local": client.personal["model"],
                           "cluster": client.payload["clusters"][int(np.argmax(u))]},
                          {name: columns for name in self.deployables})
