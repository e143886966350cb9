"""FedBABU (Oh et al., ICLR 2022, "FedBABU: Toward Enhanced Representation for Federated Image
Classification"): train and average only the body, keep the head at the common random init for all
of federated training, personalize by fine-tuning at evaluation.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from raylf.methods.base import ClientUpdate, Deployment, FitPlan, Method, MethodParams, register
from raylf.schema import OptimizerSpec
from raylf.training.layout import PARTS


class FedBABUParams(MethodParams):
    """Fine-tuning defaults from the HDC-FL paper's Table 5 (its baseline configurations): 5 epochs
    of full-model SGD at lr 1e-2, momentum 0, weight decay 0 (τ_f = 5 is also the authors')."""

    finetune_epochs: int = Field(5, ge=0, description="personalization epochs τ_f; 0 = none")
    finetune_lr: float = Field(1e-2, gt=0, description="fine-tuning SGD learning rate")
    finetune_momentum: float = Field(0.0, ge=0, lt=1, description="fine-tuning SGD momentum")
    finetune_weight_decay: float = Field(0.0, ge=0, description="fine-tuning weight decay")
    finetune_part: Literal["full", "head"] = Field(
        "full", description="full: body and head (FedBABU); head: head only (the ablation)")


@register
class FedBABU(Method):
    name = "fedbabu"
    Params = FedBABUParams
    smoke_params = {"finetune_epochs": 1}  # every client fine-tunes before each evaluation
    averaged = frozenset({"encoder"})
    deployables = ("finetuned", "global")

    def server_init(self, init):
        layout = self.ctx.layout
        return {"encoder": init[layout.part("encoder")].clone(),
                "head": init[layout.part("head")].clone()}

    def broadcast(self, state, rnd):
        """The body and the fixed head h_0 (identical for everyone: the common init)."""
        return {"encoder": state["encoder"], "head": state["head"]}

    def aggregate(self, state, uploads, rnd):
        return {**state, "encoder": uploads.mean("encoder")}, {}

    def plan(self, client):
        """Only the body trains: the head is left out of the optimizer."""
        encoder = self.ctx.layout.part("encoder")
        return FitPlan(self.model(client.payload),
                       lambda trained: ClientUpdate({"encoder": trained[encoder].clone()}),
                       trainable=("encoder",))

    @staticmethod
    def model(payload) -> torch.Tensor:
        return torch.cat([payload["encoder"], payload["head"]])

    def deploy(self, client):
        """(φ, h_0) fine-tuned on the client's training split with the fine-tuning optimizer
        (the federation's stays the one local training uses), and (φ, h_0) itself. The
        fine-tuning is seeded by round and client, so both evaluation splits score one model."""
        model, p = self.model(client.payload), self.params
        trainer = client.trainer
        trainer.load(model)
        if p.finetune_epochs:
            tuning = OptimizerSpec(lr=p.finetune_lr, momentum=p.finetune_momentum,
                                   weight_decay=p.finetune_weight_decay,
                                   grad_clip=client.optimizer.grad_clip)
            trainer.fit(client.data.x_train, client.data.y_train, seed=client.seed,
                        epochs=p.finetune_epochs, optimizer=tuning,
                        trainable=PARTS if p.finetune_part == "full" else ("head",))
        return Deployment({"finetuned": trainer.vector(), "global": model})
