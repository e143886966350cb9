"""FedAvg-SE (FedPer style: Arivazhagan et al., "Federated Learning with Personalization Layers",
2019): shared encoder averaged by n_k, private heads kept locally."""

from __future__ import annotations

from raylf.methods.base import FitPlan, Method, register
from raylf.methods.shared import PartSharing


@register
class FedAvgSE(PartSharing, Method):
    name = "fedavg_se"
    shared = "encoder"
    averaged = frozenset({"encoder"})

    def plan(self, client):
        """The shared encoder and the client's head trained together for the local epochs."""
        return FitPlan(self.model(client), self.split)
