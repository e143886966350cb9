"""FedAvg (McMahan et al., AISTATS 2017, "Communication-Efficient Learning of Deep Networks from
Decentralized Data") and FedProx (Li et al., MLSys 2020, "Federated Optimization in
Heterogeneous Networks"): one global model, n_k-weighted averaging, no personalization."""

from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from raylf.methods.base import Deployment, Method, MethodParams, register
from raylf.methods.shared import GlobalModelServer, fit_model


@register
class FedAvg(GlobalModelServer, Method):
    name = "fedavg"
    evaluation = "shared"

    def plan(self, client):
        return fit_model(client.payload)

    def deploy(self, client):
        return Deployment({"main": client.payload["model"]})


class FedProxParams(MethodParams):
    mu: float = Field(0.01, ge=0, description="proximal strength towards the received model")


@register
class FedProx(FedAvg):
    """FedAvg whose local objective adds (mu/2)·‖w − w_t‖² with w_t frozen at download."""

    name = "fedprox"
    Params = FedProxParams

    def plan(self, client):
        return replace(fit_model(client.payload), anchor=client.payload["model"],
                       mu=self.params.mu)
