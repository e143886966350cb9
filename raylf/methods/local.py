"""Local-only training: each client trains its own model on its own data; nothing is shared."""

from __future__ import annotations

from raylf.methods.base import ClientUpdate, Deployment, FitPlan, Method, register


@register
class Local(Method):
    name = "local"
    personal_state = True

    def server_init(self, init):
        return {}

    def broadcast(self, state, rnd):
        return {}

    def aggregate(self, state, uploads, rnd):
        return state, {}

    def client_init(self, cid, init):
        return init.clone()

    def plan(self, client):
        return FitPlan(client.personal, lambda trained: ClientUpdate({}, trained))

    def deploy(self, client):
        return Deployment({"main": client.personal})
