"""FedAvg-SE (FedPer style, D1b): shared encoder averaged by n_k, private heads kept locally."""

from __future__ import annotations

import torch

from raylf.methods.base import ClientUpdate, Method, register


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

    def local_update(self, trainer, payload, personal, data, seed, extra):
        trainer.load(payload["encoder"], "encoder")
        trainer.load(personal, "head")
        trainer.fit(data.x_train, data.y_train, seed=seed)
        return ClientUpdate({"encoder": trainer.vector("encoder")}, trainer.vector("head"))

    def deployable(self, payload, personal, extra):
        return torch.cat([payload["encoder"], personal])
