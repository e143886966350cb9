"""A test plugin: FedAvg whose client raises in a chosen round, to exercise retries.

The first ``failures`` attempts that reach ``fail_round`` raise (each leaves a line in the
``marker`` file); later attempts pass, so ``failures`` above a sweep's ``max_failures`` makes a
trial that fails for good.
"""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import Field

from raylf.methods import METHODS
from raylf.methods.base import MethodParams
from raylf.methods.fedavg import FedAvg


class FaultyOnceParams(MethodParams):
    fail_round: int = Field(ge=1)
    marker: str = Field(description="file counting the failures so far")
    failures: int = Field(1, ge=1, description="attempts that fail before one passes")


class FaultyOnce(FedAvg):
    name = "faulty_once"
    Params = FaultyOnceParams

    def broadcast(self, state, rnd):
        return {**super().broadcast(state, rnd), "round": torch.tensor(rnd)}

    def local_update(self, trainer, payload, personal, data, seed, extra):
        marker = Path(self.params.marker)
        failed = len(marker.read_text().splitlines()) if marker.exists() else 0
        if int(payload["round"]) == self.params.fail_round and failed < self.params.failures:
            with marker.open("a") as f:
                f.write("failed\n")
            raise RuntimeError(f"injected worker failure in round {int(payload['round'])}")
        return super().local_update(trainer, payload, personal, data, seed, extra)


if "faulty_once" not in METHODS:
    METHODS.register("faulty_once")(FaultyOnce)
