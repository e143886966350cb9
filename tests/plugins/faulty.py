"""A test plugin: FedAvg whose client raises once, in a chosen round, to exercise retries."""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import Field

from raylf.methods import METHODS
from raylf.methods.base import MethodParams
from raylf.methods.fedavg import FedAvg


class FaultyOnceParams(MethodParams):
    fail_round: int = Field(ge=1)
    marker: str = Field(description="file created by the first failure; later attempts pass")


class FaultyOnce(FedAvg):
    name = "faulty_once"
    Params = FaultyOnceParams

    def broadcast(self, state, rnd):
        return {**super().broadcast(state, rnd), "round": torch.tensor(rnd)}

    def local_update(self, trainer, payload, personal, data, seed, extra):
        marker = Path(self.params.marker)
        if int(payload["round"]) == self.params.fail_round and not marker.exists():
            marker.write_text("failed once")
            raise RuntimeError(f"injected worker failure in round {int(payload['round'])}")
        return super().local_update(trainer, payload, personal, data, seed, extra)


if "faulty_once" not in METHODS:
    METHODS.register("faulty_once")(FaultyOnce)
