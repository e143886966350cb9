"""The per-step runtime of methods whose round is one minibatch gradient per peer: SP-CACW and
its reference rules, FC: methods whose round is a single gradient step.

A round is one optimizer step of every *learner* (a client with a model of its own: SP-CACW's
targets, every client in FC), in two exchanges:

1. training: ``broadcast`` sends the learners' weights stacked (T, P); ``local_update`` on every
   client takes its next minibatch (``raylf.training.sgd``'s schedule: one pass over its own
   data per epoch, reshuffled each epoch) and its gradient there at each learner's weights it
   serves, in one vectorized call (``LocalTrainer.gradients_at``), uploaded as one plain
   (rows, P) tensor; ``aggregate`` turns the per-peer gradients into each learner's update
   direction (the subclass's rule: an α-weighted sum, a thresholded cluster mean);
2. the ``step`` phase: each learner receives its direction as its message, takes its own
   optimizer step with ``federation.optimizer`` (``raylf.training.sgd.step_``, the trainers'
   step: gradient clipping, weight decay, momentum kept across steps, lr) and uploads its new
   weights for the next broadcast (``learner_upload`` adds what the subclass needs).

Why the learner steps, not the server: the optimizer settings are the client half's (the server
half never sees them), and a learner owning its model, momentum and data is the papers'
protocol; the server needs the per-peer gradients, which come to it anyway. Every client takes
part in every step (``federation.participation`` is not used) and ``local_epochs`` has no role:
``federation.rounds`` counts steps. The rounds table's ``loss`` is each client's minibatch loss
averaged over the learners' models it served, high by design at the models of other clusters.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from raylf.methods.base import ClientUpdate, Deployment, Method, Phase
from raylf.seeding import generator
from raylf.training.sgd import minibatch, step_


def epoch_batch(n: int, batch_size: int, step: int, seed: int, cid: int) -> torch.Tensor:
    """Indices of client ``cid``'s minibatch at ``step`` (from 1): ``raylf.training.sgd``'s
    schedule, each epoch's permutation from a generator of its own (seed, client, epoch), so
    step r's batch is found without drawing the epochs before it."""
    return minibatch(lambda epoch: torch.randperm(n, generator=generator(seed, cid, epoch)),
                     n, batch_size, step - 1)


class PeerStepMethod(Method):
    """The runtime above; a subclass names its learners and turns gradients into directions."""

    personal_state = True
    round_unit = "step"

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.learners = self.learner_ids()
        self.index = {int(c): k for k, c in enumerate(self.learners)}
        self.param_slots = [s for s in ctx.layout.slots if s.is_param]
        self.has_buffers = len(self.param_slots) < len(ctx.layout.slots)

    @classmethod
    def check(cls, spec, params):
        """A learner keeps its SGD momentum across steps in its personal state; the other
        optimizers' state is not kept between steps here."""
        if spec.federation.optimizer.name == "sgd":
            return []
        return [("federation.optimizer.name", (
            f"{spec.method.name} steps its learners one step per round and keeps only SGD's "
            f"momentum between them; use name: sgd"))]

    # ---- what a subclass defines ----------------------------------------------------------
    def learner_ids(self) -> np.ndarray:
        """Sorted ids of the clients that own a model."""
        raise NotImplementedError

    def rows_for(self, cid: int, rnd: int) -> torch.Tensor:
        """Learner indices whose weights client ``cid`` computes its gradient at in ``rnd``."""
        return torch.arange(len(self.learners))

    @property
    def upload_width(self) -> int:
        """Rows every client uploads (fewer ``rows_for`` are padded with zero rows)."""
        return len(self.learners)

    def directions(self, state: dict[str, Any], grads: torch.Tensor,
                   rnd: int) -> tuple[dict[str, Any], torch.Tensor, dict[str, float]]:
        """(new state, (T, P) update directions, diagnostics) from every client's upload
        ``grads`` (clients, rows, P), clients in ascending order."""
        raise NotImplementedError

    def learner_upload(self, client, personal: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Extra tensors a learner uploads after its step, from its new ``personal`` state
        (SP-CACW: its smoothness estimate)."""
        return {}

    def after_reports(self, state: dict[str, Any], uploads,
                      rnd: int) -> tuple[dict[str, Any], dict[str, float]]:
        return state, {}

    # ---- server half ----------------------------------------------------------------------
    def server_init(self, init):
        return {"weights": init.expand(len(self.learners), -1).clone()}

    def select(self, state, rnd, rng):
        return np.arange(self.ctx.num_clients)

    def broadcast(self, state, rnd):
        return {"weights": state["weights"]}

    def aggregate(self, state, uploads, rnd):
        state, directions, diagnostics = self.directions(state, uploads.tensors["grads"], rnd)
        return {**state, "directions": directions}, diagnostics

    def phases(self):
        """Every round, after the gradients: the learners' own step along their directions."""
        return (Phase("step", request=lambda state, rnd: {}, answer=self.take_step,
                      receive=self.new_weights, messages=self.learner_directions,
                      answering=lambda state, rnd: self.learners),)

    def learner_directions(self, state, client_ids, rnd):
        """Each learner's direction (``aggregate`` left them in the state; ``new_weights``
        drops them)."""
        return {int(c): state["directions"][self.index[int(c)]] for c in client_ids}

    def new_weights(self, state, uploads, rnd):
        state = {k: v for k, v in state.items() if k != "directions"}
        rows = torch.as_tensor([self.index[int(c)] for c in uploads.senders["weights"]])
        weights = state["weights"].clone()
        weights[rows] = uploads.tensors["weights"].to(weights.dtype)
        return self.after_reports({**state, "weights": weights}, uploads, rnd)

    # ---- client half ----------------------------------------------------------------------
    def client_init(self, cid, init):
        if cid not in self.index:
            return None
        return {"weights": init.clone(), "momentum": torch.zeros_like(init)}

    def batch(self, client) -> torch.Tensor:
        """Indices of the client's minibatch at this step."""
        data = client.data
        idx = epoch_batch(data.n_train, client.trainer.batch_size, client.rnd, self.ctx.seed,
                          data.cid)
        return idx.to(data.x_train.device)

    def local_update(self, client):
        """The minibatch gradient at each learner's weights this client serves. Not a
        ``FitPlan``: no fit runs, only gradients (the learners step in the ``step`` phase)."""
        data, idx = client.data, self.batch(client)
        rows = self.rows_for(data.cid, client.rnd)
        weights = client.payload["weights"]
        grads = client.trainer.gradients_at(weights[rows.to(weights.device)], data.x_train[idx],
                                            data.y_train[idx], seed=client.seed)
        if len(rows) < self.upload_width:
            grads = torch.cat([grads, grads.new_zeros(self.upload_width - len(rows),
                                                      grads.shape[1])])
        return ClientUpdate({"grads": grads}, client.personal)

    def take_step(self, client):
        """A learner's step along its direction (``extra``) from its own weights and momentum;
        its new weights go up."""
        personal, trainer = client.personal, client.trainer
        w = personal["weights"]
        if self.has_buffers:  # running statistics follow the learner's own batches, as in fit
            trainer.load(w)
            trainer.model.train()
            with torch.no_grad():
                trainer.model(client.data.x_train[self.batch(client)])
            w = trainer.vector()
        w, momentum = self.step(w, personal["momentum"], client.extra, client.optimizer)
        personal = {**personal, "weights": w, "momentum": momentum}
        return ClientUpdate({"weights": w, **self.learner_upload(client, personal)}, personal)

    def step(self, w: torch.Tensor, momentum: torch.Tensor, direction: torch.Tensor,
             cfg) -> tuple[torch.Tensor, torch.Tensor]:
        """The learner's new flat weights and momentum after one ``raylf.training.sgd.step_`` along
        ``direction``, the step the trainers take with a gradient: on the parameter tensors
        only (buffers are neither decayed nor moved), with a client dimension of one."""
        w, momentum, direction = w.clone(), momentum.clone(), direction.to(w.device, copy=True)

        def tensors(flat: torch.Tensor) -> list[torch.Tensor]:
            return [flat[s.offset: s.offset + s.numel].view(1, *s.shape)
                    for s in self.param_slots]

        step_(tensors(w), tensors(direction), tensors(momentum) if cfg.momentum else None, cfg)
        return w, momentum

    def deploy(self, client):
        """A learner's own model; a client without one has nothing to deploy."""
        if client.personal is None:
            return Deployment({})
        return Deployment({"main": client.personal["weights"]})
