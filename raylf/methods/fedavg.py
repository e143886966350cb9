"""FedAvg and FedProx: one global model, n_k-weighted averaging, no personalization (D1a, D12)."""

from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from raylf.methods.base import ClientUpdate, FitPlan, Method, MethodParams, register


@register
class FedAvg(Method):
    name = "fedavg"
    evaluation = "shared"
    averaged = frozenset({"model"})

    def server_init(self, init):
        return {"model": init.clone()}

    def broadcast(self, state, rnd):
        return {"model": state["model"]}

    def aggregate(self, state, uploads, rnd):
        return {"model": uploads.mean("model")}, {}

    def plan(self, payload, personal, data, extra, *, rnd):
        return FitPlan(payload["model"], lambda trained: ClientUpdate({"model": trained}))

    def deployable(self, payload, personal, extra):
        return payload["model"]


class FedProxParams(MethodParams):
    mu: float = Field(0.01, ge=0, description="proximal strength towards the received model")


@register
class FedProx(FedAvg):
    """FedAvg whose local objective adds (mu/2)·‖w − w_t‖² with w_t frozen at download."""

    name = "fedprox"
    Params = FedProxParams

    def plan(self, payload, personal, data, extra, *, rnd):
        return replace(super().plan(payload, personal, data, extra, rnd=rnd),
                       anchor=payload["model"], mu=self.params.mu)
