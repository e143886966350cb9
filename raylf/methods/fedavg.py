"""FedAvg and FedProx: one global model, n_k-weighted averaging, no personalization (D1a, D12)."""

from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from raylf.methods.base import Method, MethodParams, register
from raylf.methods.shared import averaged_model, fit_model, global_model, send_model


@register
class FedAvg(Method):
    name = "fedavg"
    evaluation = "shared"
    averaged = frozenset({"model"})

    def server_init(self, init):
        return global_model(init)

    def broadcast(self, state, rnd):
        return send_model(state)

    def aggregate(self, state, uploads, rnd):
        return averaged_model(uploads), {}

    def plan(self, payload, personal, data, extra, *, rnd):
        return fit_model(payload)

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
        return replace(fit_model(payload), anchor=payload["model"], mu=self.params.mu)
