"""A method outside raylf whose local objective needs the model's features and two frozen
models, written as a plan (``FitPlan.terms`` and ``references``), so it trains in cohorts with
no code of its own: MOON's model-contrastive term (Li, He and Song, CVPR 2021, eq. 3) on the
encoder's features, with the received global model as the positive and the client's previous
local model as the negative; the client keeps that model between rounds. (A term on the outputs,
distillation towards the global model, is the worked example of docs/method-contract.md.)
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from pydantic import Field

from raylf.methods import METHODS, MethodParams
from raylf.methods.base import ClientUpdate, Deployment
from raylf.methods.fedavg import FedAvg
from raylf.methods.shared import fit_model


class ContrastiveParams(MethodParams):
    mu: float = Field(1.0, ge=0, description="the contrastive term's weight μ")
    temperature: float = Field(0.5, gt=0, description="the similarities' temperature τ")


class Contrastive(FedAvg):
    name = "contrastive"
    Params = ContrastiveParams
    personal_state = True
    evaluation = "per_client"
    deployables = ("global", "local")

    def client_init(self, cid, init):
        return init.clone()

    def plan(self, client):
        mu, tau = self.params.mu, self.params.temperature

        def contrastive(batch):
            z = batch.features.flatten(1)
            positive = F.cosine_similarity(z, batch.references["global"].features.flatten(1))
            negative = F.cosine_similarity(z, batch.references["previous"].features.flatten(1))
            logits = torch.stack([positive, negative], dim=1) / tau
            return mu * F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long,
                                                            device=z.device))

        return replace(fit_model(client.payload), terms=(contrastive,),
                       references={"global": client.payload["model"],
                                   "previous": client.personal},
                       finish=lambda trained: ClientUpdate({"model": trained}, trained))

    def deploy(self, client):
        return Deployment({"global": client.payload["model"], "local": client.personal})


if Contrastive.name not in METHODS:
    METHODS.register(Contrastive.name)(Contrastive)
