"""FedAvg-SE (FedPer style: Arivazhagan et al., "Federated Learning with Personalization Layers",
2019): shared encoder averaged by n_k, private heads kept locally."""

from __future__ import annotations

import torch

from raylf.methods.base import ClientUpdate, FitPlan, Method, register


@register
class FedAvgSE(Method):
    name = "fedavg_se"
    personal_state = True
    averaged = frozenset({"encoder"})

    def server_init(self, init):
        return {"encoder": init[self.ctx.layout.part("encoder")].clone()}

    def broadcast(self, state, rnd):
        return {"encoder": state["encoder"]}

    def aggregate(self, state, uploads, rnd):
        return {"encoder": uploads.mean("encoder")}, {}

    def client_init(self, cid, init):
        return init[self.ctx.layout.part("head")].clone()

    def plan(self, payload, personal, data, extra, *, rnd):
        encoder = self.ctx.layout.part("encoder")
        head = self.ctx.layout.part("head")
        return FitPlan(torch.cat([payload["encoder"], personal]),
                       lambda trained: ClientUpdate({"encoder": trained[encoder]},
                                                    trained[head].clone()))

    def deployable(self, payload, personal, extra):
        return torch.cat([payload["encoder"], personal])
