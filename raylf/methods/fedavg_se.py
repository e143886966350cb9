"""FedAvg-SE (FedPer style: Arivazhagan et al., "Federated Learning with Personalization Layers",
2019): shared encoder averaged by n_k, private heads kept locally."""

from __future__ import annotations

import torch

from raylf.methods.base import ClientUpdate, Deployment, FitPlan, Method, register


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

    def plan(self, client):
        encoder = self.ctx.layout.part("encoder")
        head = self.ctx.layout.part("head")
        return FitPlan(self.model(client),
                       lambda trained: ClientUpdate({"encoder": trained[encoder]},
                                                    trained[head].clone()))

    def model(self, client) -> torch.Tensor:
        """The shared encoder with the client's own head."""
        return torch.cat([client.payload["encoder"], client.personal])

    def deploy(self, client):
        return Deployment({"main": self.model(client)})
