"""FedBABU (Oh et al., ICLR 2022, "FedBABU: Toward Enhanced Representation for Federated Image
Classification"): train and average only the body, keep the head at the common random init for all
of federated training, personalize by fine-tuning at evaluation.
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
from pydantic import Field

from raylf.methods.base import (
    ClientUpdate,
    FitPlan,
    Method,
    MethodParams,
    register,
    score,
    scored_model,
)
from raylf.training.layout import PARTS
from raylf.training.sequential import LocalTrainer


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
    evaluation = "own"  # fine-tunes before scoring
    smoke_params = {"finetune_epochs": 1}  # every client fine-tunes before each evaluation
    averaged = frozenset({"encoder"})
    deployables = ("finetuned", "global")

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self._tuners: dict[int, LocalTrainer] = {}

    def server_init(self, init):
        layout = self.ctx.layout
        return {"encoder": init[layout.part("encoder")].clone(),
                "head": init[layout.part("head")].clone()}

    def broadcast(self, state, rnd):
        """The body and the fixed head h_0 (identical for everyone: the common init)."""
        return {"encoder": state["encoder"], "head": state["head"]}

    def aggregate(self, state, uploads, rnd):
        return {**state, "encoder": uploads.mean("encoder")}, {}

    def plan(self, payload, personal, data, extra, *, rnd):
        """Only the body trains: the head is left out of the optimizer."""
        encoder = self.ctx.layout.part("encoder")
        return FitPlan(self.deployable(payload, personal, extra),
                       lambda trained: ClientUpdate({"encoder": trained[encoder].clone()}),
                       trainable=("encoder",))

    def deployable(self, payload, personal, extra):
        return torch.cat([payload["encoder"], payload["head"]])

    def tuner(self, trainer: LocalTrainer) -> LocalTrainer:
        """A second trainer on a copy of the model with the fine-tuning optimizer (the
        federation's optimizer stays the one local training uses), built once per worker."""
        if id(trainer) not in self._tuners:
            p = self.params
            optimizer = trainer.opt_cfg.model_copy(update={
                "lr": p.finetune_lr, "momentum": p.finetune_momentum,
                "weight_decay": p.finetune_weight_decay})
            self._tuners[id(trainer)] = LocalTrainer(
                copy.deepcopy(trainer.model), trainer.layout, optimizer, trainer.batch_size,
                trainer.local_epochs, trainer.device)
        return self._tuners[id(trainer)]

    def evaluate(self, trainer, payload, personal, data, extra, *, rnd, seed):
        """(φ, h_0) fine-tuned on the client's training split, and (φ, h_0) itself."""
        model = self.deployable(payload, personal, extra)
        rows = [scored_model(trainer, model, data) | {"deployable": "global"}]
        tuner = self.tuner(trainer)
        tuner.load(model)
        if self.params.finetune_epochs:
            trainable = PARTS if self.params.finetune_part == "full" else ("head",)
            tuner.fit(data.x_train, data.y_train, seed=seed, epochs=self.params.finetune_epochs,
                      trainable=trainable)
        tuned = score(tuner.predict(data.x_test), data.y_test) | {"deployable": "finetuned"}
        return [tuned, *rows]
