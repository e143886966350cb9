"""Ditto (Li et al., ICML 2021, "Ditto: Fair and Robust Federated Learning Through
Personalization"): FedAvg's global model plus a personal model per client pulled towards the global
one, min F_k(v) + (λ/2)‖v − w^t‖².

Each round a participant first trains its personal model v_k (resident on its worker) for
``personal_epochs`` with the proximal gradient λ(v_k − w^t) anchored at the received w^t, then
trains its copy of w^t exactly as FedAvg does and uploads it (n_k-weighted mean). Both fits are
one ``FitPlan`` of two stages, so participants train in cohorts; the personal fit shuffles by
its own stream (``seed_stream``), not repeating the global fit's order. Both are
evaluated: ``personal`` (v_k, the method's model) and ``global`` (w^t) in separate columns
(``acc_mean`` and ``acc_mean_global``), never mixed as PFLlib's log does.
"""

from __future__ import annotations

import torch
from pydantic import Field

from raylf.methods.base import ClientUpdate, Deployment, FitPlan, Method, MethodParams, register
from raylf.methods.shared import GlobalModelServer


class DittoParams(MethodParams):
    """Defaults: λ = 1 (the authors' scripts), one personal epoch
    (PFLlib ``plocal_epochs``, FL-bench ``pers_epoch``)."""

    lam: float = Field(1.0, ge=0, description="proximal strength λ of the personal model "
                                              "towards the received global model")
    personal_epochs: int = Field(1, ge=1, description="epochs of the personal update per round")


@register
class Ditto(GlobalModelServer, Method):
    name = "ditto"
    Params = DittoParams
    personal_state = True
    deployables = ("personal", "global")

    def client_init(self, cid, init):
        return init.clone()

    def plan(self, client):
        """v_k's proximal fit, then w^t's plain one (the upload)."""
        anchor = client.payload["model"]

        def global_fit(trained_personal: torch.Tensor) -> FitPlan:
            return FitPlan(anchor, lambda model: ClientUpdate({"model": model}, trained_personal))

        return FitPlan(client.personal, global_fit, anchor=anchor, mu=self.params.lam,
                       epochs=self.params.personal_epochs, seed_stream=(0,))

    def deploy(self, client):
        return Deployment({"personal": client.personal, "global": client.payload["model"]})

