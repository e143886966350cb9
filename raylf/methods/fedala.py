"""FedALA (Zhang et al., AAAI 2023, "FedALA: Adaptive Local Aggregation for Personalized Federated
Learning"): FedAvg on the server; on download each client mixes the global model into its own by
adaptive local aggregation (ALA) before training.

ALA: the parameter tensors below the top ``layers`` take the global model Θ; the top ones become
θ̂ = θ_k + (Θ − θ_k) ⊙ W_k, with element-wise weights W_k ∈ [0, 1] learned on a random
``fraction`` of the client's training data by W ← clip(W − η ∂L(θ̂)/∂W, 0, 1) (autograd through a
functional forward with θ̂ substituted; ∂L/∂W = g ⊙ (Θ − θ_k), the paper's update). The first
ALA repeats passes until the per-pass loss stops improving; later ones make one pass. Then E
epochs of local SGD from θ̂, and the full θ_k goes up. When θ_k equals Θ (round 1) there is
nothing to mix and ALA is skipped.

Decision — stopping the first ALA: the HDC-FL paper's Table 5 (at most 50 passes, patience 3,
tolerance 1e-4: stop after 3 passes without a mean pass loss 1e-4 below the best) instead of the
author's std of the last 10 losses < 0.1. The pass loss is the mean of its minibatch losses (the
author records the last one).
Decision — who runs ALA: the round's participants (the paper's Algorithm 1); the author code
runs it for every client at every broadcast. Evaluation is "right after ALA" (as the
author code): ``deploy`` runs the ALA the client would run now (the start phase if it never
had one) and deploys θ̂, keeping nothing.
Decision — buffers (BatchNorm statistics) are not parameter tensors: they come from Θ with the
lower layers, since the server averages them with the rest of the vector.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field
from torch.func import functional_call

from raylf.methods.base import ClientUpdate, Deployment, Method, MethodParams, register
from raylf.methods.shared import GlobalModelServer
from raylf.seeding import generator
from raylf.training.layout import Slot


class FedALAParams(MethodParams):
    """Defaults: the HDC-FL paper's Table 5 (p = 2 tensors, s = 80 %, η = 1; first ALA capped at 50
    passes, patience 3, tolerance 1e-4)."""

    layers: int = Field(2, ge=1, description="p: how many of the last parameter tensors ALA "
                                             "mixes (2 = the head's weight and bias)")
    fraction: float = Field(0.8, gt=0, le=1, description="s: share of the training data, drawn "
                                                         "at random, that learns the weights")
    eta: float = Field(1.0, gt=0, description="η: learning rate of the element-wise weights")
    start_passes: int = Field(50, ge=1, description="most passes of the first ALA")
    patience: int = Field(3, ge=1, description="first ALA stops after this many passes without "
                                               "improvement")
    tolerance: float = Field(1e-4, ge=0, description="the least drop of the pass loss that counts "
                                                     "as an improvement")


def top_slots(slots: tuple[Slot, ...], count: int) -> list[Slot]:
    """The last ``count`` parameter tensors of a layout (buffers are not parameters)."""
    params = [s for s in slots if s.is_param]
    if count > len(params):
        raise ValueError(f"method.params.layers: {count} exceeds the model's {len(params)} "
                         "parameter tensors")
    return params[-count:]


class ALA:
    """The weight learning of one client: θ_k, Θ and the top tensors' slots fixed."""

    def __init__(self, trainer, slots: list[Slot], local: torch.Tensor, glob: torch.Tensor):
        self.trainer, self.slots = trainer, slots
        self.rows = torch.cat([torch.arange(s.offset, s.offset + s.numel) for s in slots])
        self.local = local[self.rows.to(local.device)]
        self.diff = glob[self.rows.to(glob.device)] - self.local
        self.base = glob.clone()

    def mixed(self, weights: torch.Tensor) -> torch.Tensor:
        return self.local + self.diff * weights

    def model(self, weights: torch.Tensor) -> torch.Tensor:
        """The full vector θ̂: Θ below the top tensors, their element-wise mix at the top."""
        out = self.base.clone()
        out[self.rows.to(out.device)] = self.mixed(weights).detach()
        return out

    def one_pass(self, weights, x, y, eta: float, gen: torch.Generator) -> tuple[torch.Tensor,
                                                                                  float]:
        """One pass over (x, y) in a random order; returns the new weights and the mean loss."""
        model = self.trainer.model
        model.train()
        losses = []
        order = torch.randperm(len(y), generator=gen).to(y.device)
        for start in range(0, len(y), self.trainer.batch_size):
            idx = order[start: start + self.trainer.batch_size]
            w = weights.detach().requires_grad_(True)
            flat = self.mixed(w)
            params = {s.name: flat[i: i + s.numel].view(s.shape)
                      for s, i in zip(self.slots, offsets(self.slots))}
            loss = F.cross_entropy(functional_call(model, params, (x[idx],)), y[idx])
            (grad,) = torch.autograd.grad(loss, w)
            weights = (w.detach() - eta * grad).clamp_(0, 1)
            losses.append(float(loss.detach()))
        return weights, sum(losses) / max(len(losses), 1)


def offsets(slots: list[Slot]) -> list[int]:
    """Start of each slot inside the concatenation of ``slots``."""
    starts, total = [], 0
    for s in slots:
        starts.append(total)
        total += s.numel
    return starts


@register
class FedALA(GlobalModelServer, Method):  # server half: FedAvg's global model
    name = "fedala"
    Params = FedALAParams
    personal_state = True
    smoke_params = {"start_passes": 2}  # the first ALA's passes: 50 ResNet-18 passes per client

    # ---- client half ---------------------------------------------------------------------
    @property
    def slots(self) -> list[Slot]:
        return top_slots(self.ctx.layout.slots, self.params.layers)

    def client_init(self, cid, init):
        size = sum(s.numel for s in self.slots)
        return {"model": init.clone(), "weights": torch.ones(size), "started": False}

    def adapt(self, trainer, glob: torch.Tensor, personal, data, seed: int):
        """ALA: the mixed model θ̂ and the state after it (weights, whether the start is done)."""
        if torch.equal(personal["model"], glob):
            return glob.clone(), personal
        ala = ALA(trainer, self.slots, personal["model"], glob)
        trainer.load(ala.base)
        for p in trainer.model.parameters():
            p.requires_grad_(False)  # only W is learned; the lower layers need no graph
        gen = generator(seed)
        n = len(data.y_train)
        subset = torch.randperm(n, generator=gen)[: max(1, math.ceil(self.params.fraction * n))]
        subset = subset.to(data.y_train.device)
        x, y = data.x_train[subset], data.y_train[subset]
        weights = personal["weights"].to(glob.device)
        passes = 1 if personal["started"] else self.params.start_passes
        best, stale = math.inf, 0
        for _ in range(passes):
            weights, loss = ala.one_pass(weights, x, y, self.params.eta, gen)
            if loss < best - self.params.tolerance:
                best, stale = loss, 0
            else:
                stale += 1
                if stale >= self.params.patience:
                    break
        return ala.model(weights), personal | {"weights": weights, "started": True}

    def local_update(self, client):
        """ALA, then FedAvg's fit from θ̂. Not a ``FitPlan`` (so not trained in cohorts): the
        start θ̂ comes out of ALA, a gradient loop of its own on the mixing weights W (clipped
        to [0, 1], no momentum: not local SGD of the model) run on the trainer before the fit,
        and a plan is declared before the worker runs anything; the fit itself is
        ``LocalTrainer.fit``'s (``raylf.training.sgd``)."""
        trainer, data = client.trainer, client.data
        start, personal = self.adapt(trainer, client.payload["model"], client.personal, data,
                                     client.seed)
        trainer.load(start)
        trainer.fit(data.x_train, data.y_train, seed=client.seed)
        model = trainer.vector()
        return ClientUpdate({"model": model}, personal | {"model": model})

    def deploy(self, client):
        """θ̂ from the ALA the client would run now, seeded by round and client."""
        start, _ = self.adapt(client.trainer, client.payload["model"], client.personal,
                              client.data, client.seed)
        return Deployment({"main": start})
