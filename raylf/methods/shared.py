"""Pieces several method families are built from, as small functions of state, uploads and data.

Methods reuse each other through these, never by subclassing another family's method or
importing from another method's module: FedALA, Ditto and FedPureCNN keep FedAvg's global
model without being FedAvgs, and IFCA, FedSoft, PACFL and the clustered oracle average their
group models the same way without one depending on another.
"""

from __future__ import annotations

import torch

from raylf.methods.base import (
    ClientRound,
    ClientUpdate,
    Deployment,
    FitPlan,
    Tensors,
    Uploads,
    share,
)


# ---- one global model, n_k-averaged (FedAvg's server half) --------------------------------------
def global_model(init: torch.Tensor) -> Tensors:
    """The server's state: one model, at the common init."""
    return {"model": init.clone()}


def send_model(state: Tensors) -> Tensors:
    """The broadcast: the global model, to every participant."""
    return {"model": state["model"]}


def averaged_model(uploads: Uploads) -> Tensors:
    """The new global model: the n_k-weighted mean of the uploaded ``model`` shares (a method
    using this declares ``averaged = frozenset({"model"})``)."""
    return {"model": uploads.mean("model")}


class GlobalModelServer:
    """FedAvg's server half as one piece: one global model, broadcast to every participant,
    replaced by the n_k-weighted mean of the uploads. FedAvg, FedALA, Ditto and FedPureCNN put
    it before ``Method`` in their bases and write only their client half; it is a server half,
    not a family, so none of them is a FedAvg."""

    averaged = frozenset({"model"})

    def server_init(self, init):
        return global_model(init)

    def broadcast(self, state, rnd):
        return send_model(state)

    def aggregate(self, state, uploads, rnd):
        return averaged_model(uploads), {}


def upload_model(trained: torch.Tensor) -> ClientUpdate:
    """A fit's update that uploads the trained model and keeps nothing on the client."""
    return ClientUpdate({"model": trained})


def fit_model(payload: Tensors) -> FitPlan:
    """FedAvg's local update: the received model fitted, then uploaded."""
    return FitPlan(payload["model"], upload_model)


# ---- FedAvg inside fixed groups (IFCA's, FedSoft's, PACFL's and the oracle's models) ------------
def group_means(models: torch.Tensor, uploads: Uploads, key: str = "model") -> torch.Tensor:
    """``models`` (G, P) with each group that received shares of ``key`` replaced by their
    weighted mean; a group nobody shared with keeps its model. One copy, however many groups."""
    chosen = set(uploads.groups(key))
    return torch.stack([uploads.mean(key, g) if g in chosen else models[g]
                        for g in range(len(models))])


def group_state(init: torch.Tensor, groups: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every group's model at the common init, and each client's group id (0..G−1)."""
    return {"models": init.repeat(int(groups.max()) + 1, 1), "cluster": groups}


def group_extras(state, client_ids) -> dict[int, dict]:
    """A client's group id and model (per client, so bytes down count one model each)."""
    ids = state["cluster"]
    return {int(c): {"cluster": int(ids[c]), "model": state["models"][ids[c]]}
            for c in client_ids}


def group_plan(client: ClientRound) -> FitPlan:
    """FedAvg's update from the group model, uploaded as a share of weight n_k in the group."""
    extra = client.extra
    return FitPlan(extra["model"], lambda trained: ClientUpdate(
        {"model": share(trained, client.data.n_train, extra["cluster"])}))


def group_deployment(client: ClientRound) -> Deployment:
    """The client's group model, its rows marked with the group id (``cluster``)."""
    return Deployment({"main": client.extra["model"]},
                      {"main": {"cluster": client.extra["cluster"]}})
