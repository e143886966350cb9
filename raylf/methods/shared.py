"""Pieces several method families are built from, as small functions of state, uploads and data.

Methods reuse each other through these, never by subclassing another family's method or
importing from another method's module: FedALA, Ditto and FedPureCNN keep FedAvg's global
model without being FedAvgs, IFCA, FedSoft, PACFL and the clustered oracle average their
group models the same way without one depending on another, and FedAvg-SE, FedRep and
LG-FedAvg share one part of the model while keeping the other.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

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
from raylf.schema import OptimizerSpec
from raylf.training import sgd
from raylf.training.layout import PARTS, ParamLayout


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


# ---- one part shared, the other private (FedAvg-SE, FedRep, LG-FedAvg) -------------------------
class PartSharing:
    """One part of the model (``shared``: the encoder, or the head) on the server, broadcast to
    every participant and replaced by the n_k-weighted mean of the uploads; the other part is
    each client's own, resident on its worker from the common init. FedAvg-SE and FedRep share
    the encoder (body) and keep the head; LG-FedAvg shares the head and keeps the encoder. A
    method puts it before ``Method`` in its bases, declares ``averaged = {shared}``, and writes
    its ``plan``; every client is scored with the received part joined to its own."""

    shared: ClassVar[str] = "encoder"
    personal_state = True

    @property
    def private(self) -> str:
        return next(part for part in PARTS if part != self.shared)

    def server_init(self, init):
        return {self.shared: init[self.ctx.layout.part(self.shared)].clone()}

    def broadcast(self, state, rnd):
        return {self.shared: state[self.shared]}

    def aggregate(self, state, uploads, rnd):
        return {self.shared: uploads.mean(self.shared)}, {}

    def client_init(self, cid, init):
        return init[self.ctx.layout.part(self.private)].clone()

    def model(self, client: ClientRound) -> torch.Tensor:
        """The received shared part joined to the client's own part, encoder first."""
        parts = {self.shared: client.payload[self.shared], self.private: client.personal}
        return torch.cat([parts[part] for part in PARTS])

    def split(self, trained: torch.Tensor) -> ClientUpdate:
        """A trained model's update: its shared part goes up, its own part stays."""
        layout = self.ctx.layout
        return ClientUpdate({self.shared: trained[layout.part(self.shared)].clone()},
                            trained[layout.part(self.private)].clone())

    def deploy(self, client):
        return Deployment({"main": self.model(client)})


# ---- a local loop written by hand (APFL, Per-FedAvg) ---------------------------------------------
def local_batches(client: ClientRound, count: int | None = None) -> Iterator[torch.Tensor]:
    """Sample indices of the minibatches a fit of this client would take this round: the
    trainers' schedule (``raylf.training.sgd``) from the client's round seed, for the
    federation's local epochs, or ``count`` minibatches (more than an epoch's run on into the
    next permutation)."""
    trainer, n = client.trainer, client.data.n_train
    batch = trainer.batch_size
    steps = sgd.step_count(n, batch, trainer.local_epochs) if count is None else count
    orders = sgd.SeededOrders(n, client.seed, trainer.device)
    return sgd.minibatches(orders, n, batch, steps)


class ModelSteps:
    """The local optimizer's steps on k flat models stacked (k, P), its state kept across the
    steps of a loop written by hand (APFL's global copy and personal model, Per-FedAvg's meta
    steps): ``raylf.training.sgd.step_``, the trainers' own arithmetic (prox-free, clipped per
    model, then SGD's or Adam's step), on the parameter entries, each model with its own
    optimizer state; buffers (BatchNorm statistics) are neither decayed nor moved."""

    def __init__(self, models: torch.Tensor, layout: ParamLayout, cfg: OptimizerSpec):
        self.models = models.clone()
        self.slots = [s for s in layout.slots if s.is_param]
        self.cfg = cfg
        self.state = sgd.zero_state(self._tensors(self.models), cfg)
        self.taken = 0

    def _tensors(self, flat: torch.Tensor) -> list[torch.Tensor]:
        rows = len(flat)
        return [flat[:, s.offset: s.offset + s.numel].view(rows, *s.shape) for s in self.slots]

    def step(self, grads: torch.Tensor) -> None:
        """One step of every model along its row of ``grads`` (k, P)."""
        self.taken += 1
        sgd.step_(self._tensors(self.models), self._tensors(grads.clone()), self.state, self.cfg,
                  step=self.taken)


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
