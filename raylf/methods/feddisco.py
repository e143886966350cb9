"""FedDisco (Ye et al., ICML 2023, "FedDisco: Federated Learning with Discrepancy-Aware
Collaboration"): FedAvg whose aggregation weights account for each client's label-distribution
discrepancy from a uniform target as well as its size.

Every client sends its label histogram once (the setup phase); each round the server gives every
participant k its weight p_k ∝ ReLU(n̄_k − a·d_k + b), with n̄_k = n_k / Σ n_j and d_k the
KL divergence of k's label distribution from uniform, both normalized over the round's
participants (the author code's KL mode), and p = n̄ when every value inside the ReLU is ≤ 0
(where the author code divides by zero). Each participant uploads its model as a share of weight
p_k, so the workers reduce the weighted sum. Evaluated with the global model.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from raylf.methods.base import (
    ClientUpdate,
    Deployment,
    FitPlan,
    Method,
    MethodParams,
    register,
    share,
)


class FedDiscoParams(MethodParams):
    """Defaults a = 0.5, b = 0.1, KL to a uniform target (the paper and author
    scripts)."""

    a: float = Field(0.5, ge=0, description="weight of the discrepancy d_k")
    b: float = Field(0.1, description="offset inside the ReLU")


def kl_to_uniform(counts: np.ndarray) -> np.ndarray:
    """KL(P_k ‖ U) per row of label counts (N, C), 0·log 0 = 0."""
    p = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1) * counts.shape[1]), 0.0)
    return terms.sum(1)


def disco_weights(n: np.ndarray, d: np.ndarray, a: float, b: float) -> tuple[np.ndarray, bool]:
    """(p over the participants, whether the n̄ fallback was taken)."""
    n_bar = n / n.sum()
    d = d / d.sum() if d.sum() > 0 else np.zeros_like(d)
    raw = np.maximum(n_bar - a * d + b, 0.0)
    if raw.sum() <= 0:
        return n_bar, True
    return raw / raw.sum(), False


@register
class FedDisco(Method):
    name = "feddisco"
    Params = FedDiscoParams
    evaluation = "shared"

    def server_init(self, init):
        """No discrepancy (d = 0, weights from sizes alone) until the histograms arrive."""
        return {"model": init.clone(),
                "discrepancy": torch.zeros(self.ctx.num_clients, dtype=torch.float64)}

    def setup(self, client):
        return {"labels": torch.bincount(client.data.y_train,
                                         minlength=self.ctx.num_classes).float()}

    def server_setup(self, state, uploads):
        counts = uploads.tensors["labels"].double().numpy()
        return {**state, "discrepancy": torch.from_numpy(kl_to_uniform(counts))}

    def weights(self, state, client_ids: np.ndarray) -> tuple[np.ndarray, bool]:
        d = state["discrepancy"].numpy()[client_ids]
        n = self.ctx.n_train[client_ids].astype(np.float64)
        return disco_weights(n, d, self.params.a, self.params.b)

    def extras(self, state, client_ids, rnd):
        p, _ = self.weights(state, client_ids)
        return {int(c): float(w) for c, w in zip(client_ids, p)}

    def broadcast(self, state, rnd):
        return {"model": state["model"]}

    def aggregate(self, state, uploads, rnd):
        _, fallback = self.weights(state, uploads.client_ids)
        return {**state, "model": uploads.mean("model")}, {"disco_fallback": float(fallback)}

    def plan(self, client):
        return FitPlan(client.payload["model"],
                       lambda trained: ClientUpdate({"model": share(trained, client.extra)}))

    def deploy(self, client):
        return Deployment({"main": client.payload["model"]})
