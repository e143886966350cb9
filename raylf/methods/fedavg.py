"""FedAvg and FedProx: one global model, n_k-weighted averaging, no personalization (D1a, D12)."""

from __future__ import annotations

from pydantic import Field

from raylf.methods.base import ClientUpdate, Method, MethodParams, register


@register
class FedAvg(Method):
    name = "fedavg"
    shared_deployable = True
    averaged = frozenset({"model"})

    def server_init(self, init):
        return {"model": init.clone()}

    def broadcast(self, state, rnd):
        return {"model": state["model"]}

    def aggregate(self, state, uploads, rnd):
        return {"model": uploads.mean("model")}, {}

    def local_update(self, trainer, payload, personal, data, seed, extra):
        trainer.load(payload["model"])
        trainer.fit(data.x_train, data.y_train, seed=seed, prox=self.anchor(payload))
        return ClientUpdate({"model": trainer.vector()})

    def anchor(self, payload):
        return None

    def deployable(self, payload, personal, extra):
        return payload["model"]


class FedProxParams(MethodParams):
    mu: float = Field(0.01, ge=0, description="proximal strength towards the received model")


@register
class FedProx(FedAvg):
    """FedAvg whose local objective adds (mu/2)·‖w − w_t‖² with w_t frozen at download."""

    name = "fedprox"
    Params = FedProxParams

    def anchor(self, payload):
        return payload["model"], self.params.mu
