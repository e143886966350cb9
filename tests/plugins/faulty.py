"""A test plugin: FedAvg whose client raises in a chosen round, to exercise retries.

The first ``failures`` attempts that reach ``fail_round`` raise (each leaves a line in the
``marker`` file); later attempts pass, so ``failures`` above a sweep's ``max_failures`` makes a
trial that fails for good. With ``hang`` those attempts hang instead of raising: a round that
only ``resources.round_timeout_s`` can end.
"""

from __future__ import annotations

import threading
from pathlib import Path

from pydantic import Field

from raylf.methods import METHODS
from raylf.methods.base import MethodParams
from raylf.methods.fedavg import FedAvg


class FaultyOnceParams(MethodParams):
    fail_round: int = Field(ge=1)
    marker: str = Field(description="file counting the failures so far")
    failures: int = Field(1, ge=1, description="attempts that fail before one passes")
    hang: bool = Field(False, description="fail by waiting (HANG_S) instead of raising")


HANG_S = 600.0  # far beyond any round timeout a test sets; the process ends before it


class FaultyOnce(FedAvg):
    name = "faulty_once"
    Params = FaultyOnceParams

    def local_update(self, client):
        marker = Path(self.params.marker)
        failed = len(marker.read_text().splitlines()) if marker.exists() else 0
        if client.rnd == self.params.fail_round and failed < self.params.failures:
            with marker.open("a") as f:
                f.write("failed\n")
            if self.params.hang:
                threading.Event().wait(HANG_S)
            raise RuntimeError(f"injected worker failure in round {client.rnd}")
        return super().local_update(client)


if "faulty_once" not in METHODS:
    METHODS.register("faulty_once")(FaultyOnce)
