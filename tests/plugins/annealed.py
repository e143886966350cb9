"""A test plugin: a method written outside raylf, as a user's would be, for ``check_method``.

``annealed_prox`` is FedProx whose pull towards the downloaded model weakens as μ/round, so
its update reads the round number the runtime passes to every hook (the contract's ``rnd``).
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from raylf.methods import METHODS, MethodParams
from raylf.methods.fedavg import FedAvg


class AnnealedProxParams(MethodParams):
    mu: float = Field(0.1, ge=0, description="proximal strength in round 1")


class AnnealedProx(FedAvg):
    name = "annealed_prox"
    Params = AnnealedProxParams

    def plan(self, client):
        return replace(super().plan(client), anchor=client.payload["model"],
                       mu=self.params.mu / client.rnd)


if "annealed_prox" not in METHODS:
    METHODS.register("annealed_prox")(AnnealedProx)
