"""Per-FedAvg (Fallah, Mokhtari and Ozdaglar, NeurIPS 2020, "Personalized Federated Learning with
Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach"): FedAvg of a model meant to be
personalized by one gradient step, the MAML objective (eq. 3)
min_w (1/n) Σ_i f_i(w − α ∇f_i(w)).

Each local step of a participant (Algorithm 1) draws independent minibatches D, D′ (and D″):

- w̃ = w − α ∇f_i(w; D), the one-step adaptation;
- w ← w − β (I − α ∇²f_i(w; D″)) ∇f_i(w̃; D′) (eq. 7's stochastic gradient of eq. 3), with the
  Hessian-vector product taken one of two ways (Section 5's variants):

  - ``fo`` (Per-FedAvg FO): dropped, w ← w − β ∇f_i(w̃; D′);
  - ``hf`` (Per-FedAvg HF, eq. 9): by the finite difference
    (∇f_i(w + δ g; D″) − ∇f_i(w − δ g; D″)) / (2δ) with g = ∇f_i(w̃; D′).

β is the federation's ``optimizer.lr``, and the step along the meta-gradient is the federation's
optimizer (plain SGD with its defaults, as the paper's; momentum or Adam when the spec sets
them). The server averages the uploaded w. At evaluation every client adapts the received model
by one SGD step of size α on one minibatch of its training data (the paper's evaluation,
Section 5), the reported model (``adapted``); the received model is scored beside it
(``global``). The adaptation is seeded by round and client and nothing of it persists.

Each meta-step takes two (``fo``) or three (``hf``) minibatches of the client's schedule in
turn; a round takes as many meta-steps as the federation's local epochs have minibatches, over
two or three, rounded up (PFLlib's ``fo``: a pass over batches of 2B is one epoch).

Not a ``FitPlan``: the meta-gradient is the loss's gradient at the adapted point w̃ (and, for
``hf``, at w ± δ g), not at the parameters being trained, and a plan's loss terms see only the
trained model's outputs at its own parameters and frozen references' outputs. The loop is
written here with the trainers' own pieces: their minibatch schedule from the client's seed
(``local_batches``), ``LocalTrainer.gradient`` and ``raylf.training.sgd.step_`` for the meta
steps with their optimizer state (``ModelSteps``); it runs one client at a time. w's running
statistics (BatchNorm) advance with its forward pass on D; those at w̃ and w ± δ g are
discarded.

Where raylf follows the paper and PFLlib does not: the one-step adaptation at evaluation uses the
client's training data (PFLlib's older versions took the step on a test minibatch) and its own
step α (PFLlib sets α = β = the learning rate); ``hf`` is PFLlib-less. Shared with the authors'
code and PFLlib: the server's mean weights each upload by n_k (Algorithm 1 writes the plain mean
over participants; equal for equal sizes).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field

from raylf.methods.base import ClientUpdate, Deployment, Method, MethodParams, register
from raylf.methods.shared import GlobalModelServer, ModelSteps, local_batches
from raylf.schema import OptimizerSpec
from raylf.training import sgd
from raylf.training.sequential import FitResult, seed_global


class PerFedAvgParams(MethodParams):
    """δ = 0.001 is the paper's (Section 5). α, the personalization step, is decided on digits
    validation data (the module's figures)."""

    variant: Literal["fo", "hf"] = Field(
        "fo", description="fo: first-order (the Hessian term dropped); hf: Hessian-free (the "
                          "Hessian-vector product by a finite difference of gradients, eq. 9)")
    alpha: float = Field(0.01, gt=0, description="α: the one-step adaptation's step size, in "
                                                 "training and at evaluation")
    delta: float = Field(1e-3, gt=0, description="δ: the finite difference's step (hf only)")


@register
class PerFedAvg(GlobalModelServer, Method):
    """Per-FedAvg: FedAvg of a meta-model trained by MAML steps, each client personalizing it by
    one gradient step at evaluation."""

    name = "perfedavg"
    Params = PerFedAvgParams
    deployables = ("adapted", "global")

    @property
    def batches_per_step(self) -> int:
        return 3 if self.params.variant == "hf" else 2

    def local_update(self, client):
        trainer, data = client.trainer, client.data
        k = self.batches_per_step
        meta_steps = max(1, math.ceil(sgd.step_count(data.n_train, trainer.batch_size,
                                                     trainer.local_epochs) / k))
        batches = local_batches(client, meta_steps * k)
        steps = ModelSteps(client.payload["model"][None], self.ctx.layout, client.optimizer)
        seed_global(client.seed, trainer.device)
        losses, samples = [], 0
        for _ in range(meta_steps):
            minibatches = [next(batches) for _ in range(k)]
            direction, loss = self.meta_gradient(trainer, steps.models[0], [
                (data.x_train[idx], data.y_train[idx]) for idx in minibatches])
            losses.append(loss)
            steps.step(direction[None])
            samples += sum(len(idx) for idx in minibatches)
        model = steps.models[0]
        trainer.load(model)
        trainer.fits.append(FitResult(sum(losses) / len(losses), meta_steps, samples))
        return ClientUpdate({"model": model.clone()})

    def meta_gradient(self, trainer, w: torch.Tensor, batches) -> tuple[torch.Tensor, float]:
        """Algorithm 1's step direction at w (whose running statistics advance in place with
        its forward pass on D) — ∇f(w̃; D′), minus α times the Hessian-vector product's finite
        difference on D″ for ``hf`` — and the adapted model's loss f(w̃; D′)."""
        alpha = self.params.alpha
        (x, y), (x2, y2) = batches[:2]
        trainer.load(w)
        inner = trainer.gradient(x, y, advance_statistics=True)
        w.copy_(trainer.vector())
        trainer.load(w - alpha * inner)
        outer = trainer.gradient(x2, y2)
        loss = trainer.fits[-1].loss
        if self.params.variant == "fo":
            return outer, loss
        x3, y3 = batches[2]
        delta = self.params.delta
        trainer.load(w + delta * outer)
        plus = trainer.gradient(x3, y3)
        trainer.load(w - delta * outer)
        minus = trainer.gradient(x3, y3)
        return outer - alpha * (plus - minus) / (2 * delta), loss

    def deploy(self, client):
        """The received model after one SGD step of size α on one minibatch of the client's
        training data, and the received model itself."""
        received, trainer = client.payload["model"], client.trainer
        trainer.load(received)
        step = OptimizerSpec(lr=self.params.alpha)
        trainer.fit(client.data.x_train, client.data.y_train, seed=client.seed, max_steps=1,
                    optimizer=step)
        return Deployment({"adapted": trainer.vector(), "global": received})
