"""The two halves every method implements, and the defaults most methods share.

Server half (runs in the coordinator): ``server_init``, ``select``, ``broadcast``, ``extras``,
``aggregate``. Client half (runs in a worker, once per virtual client): ``client_init``,
``local_update``, ``deployable``, ``evaluate``. Both are plain functions of tensors and dicts;
nothing here imports Ray, so a method is unit-testable on its own and runs unchanged on every
backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict

from raylf.data.federation import ClientData
from raylf.training import FitResult, LocalTrainer, ParamLayout, weighted_mean

Tensors = dict[str, torch.Tensor]


class MethodParams(BaseModel):
    """Hyperparameters of a method; subclasses declare them with types, bounds and defaults."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class MethodContext:
    """What both halves may know about the experiment (never another client's data)."""

    layout: ParamLayout
    num_clients: int
    n_train: np.ndarray
    num_classes: int
    rounds: int
    participants_per_round: int
    seed: int


@dataclass
class Uploads:
    """The uploads of one round: per-client tensors stacked per key in ascending client order,
    and the n_k-weighted means of the keys the method declares ``averaged`` (reduced on the
    workers, so those never exist per client on the server)."""

    client_ids: np.ndarray
    n_train: torch.Tensor
    tensors: Tensors = field(default_factory=dict)
    means: Tensors = field(default_factory=dict)

    def mean(self, key: str) -> torch.Tensor:
        """Σ_k n_k v_k / Σ_k n_k over this round's uploads of ``key``."""
        if key in self.means:
            return self.means[key]
        return weighted_mean(self.tensors[key], self.n_train)


@dataclass
class ClientUpdate:
    upload: Tensors
    personal: Any
    fit: FitResult
    metrics: dict[str, float] = field(default_factory=dict)


class Method:
    name: ClassVar[str]
    Params: ClassVar[type[MethodParams]] = MethodParams
    personal_state: ClassVar[bool] = False
    """True when clients keep resident state (a private head, a personal model) across rounds."""
    shared_deployable: ClassVar[bool] = False
    """True when every client is evaluated with the same broadcast model (one pass per shard)."""
    averaged: ClassVar[frozenset[str]] = frozenset()
    """Upload keys the server reads only through ``Uploads.mean``. A worker sums n_k·v_k over its
    clients and returns one vector per key instead of one per client: the round's return message
    and the server's memory stop growing with participants. Bytes up still count per client."""

    def __init__(self, params: MethodParams, ctx: MethodContext):
        self.params = params
        self.ctx = ctx

    # ---- server half ---------------------------------------------------------------------
    def server_init(self, init: torch.Tensor) -> dict[str, Any]:
        raise NotImplementedError

    def select(self, state: dict[str, Any], rnd: int, rng: np.random.Generator) -> np.ndarray:
        """Uniform sampling without replacement from the round's participation stream."""
        chosen = rng.choice(self.ctx.num_clients, self.ctx.participants_per_round, replace=False)
        return np.sort(chosen)

    def broadcast(self, state: dict[str, Any], rnd: int) -> Tensors:
        raise NotImplementedError

    def extras(self, state: dict[str, Any], client_ids: np.ndarray) -> dict[int, Any]:
        """Small per-client messages next to the broadcast (a cluster id, mixture weights)."""
        return {}

    def aggregate(self, state: dict[str, Any], uploads: Uploads,
                  rnd: int) -> tuple[dict[str, Any], dict[str, float]]:
        """New server state and this round's diagnostics (rounds-table columns)."""
        raise NotImplementedError

    # ---- client half ---------------------------------------------------------------------
    def client_init(self, cid: int, init: torch.Tensor) -> Any:
        return None

    def local_update(self, trainer: LocalTrainer, payload: Tensors, personal: Any,
                     data: ClientData, seed: int, extra: Any) -> ClientUpdate:
        raise NotImplementedError

    def deployable(self, payload: Tensors, personal: Any, extra: Any) -> torch.Tensor:
        """The flat parameter vector this client is evaluated with."""
        raise NotImplementedError

    def evaluate(self, trainer: LocalTrainer, payload: Tensors, personal: Any, data: ClientData,
                 extra: Any) -> list[dict[str, Any]]:
        """Clients-table rows for one client: accuracy and loss of its deployable model."""
        trainer.load(self.deployable(payload, personal, extra))
        return [score(trainer.predict(data.x_test), data.y_test)]


def score(logits: torch.Tensor, y: torch.Tensor, task: str = "main") -> dict[str, Any]:
    n = len(y)
    if n == 0:
        return {"task": task, "n_test": 0, "correct": 0, "accuracy": None, "loss": None}
    correct = int((logits.argmax(1) == y).sum())
    loss = float(F.cross_entropy(logits, y))
    return {"task": task, "n_test": n, "correct": correct, "accuracy": correct / n, "loss": loss}
