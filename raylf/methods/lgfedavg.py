"""LG-FedAvg (Liang et al., 2020, "Think Locally, Act Globally: Federated Learning with Local and
Global Representations"): each client keeps its own lower layers (a local representation) and
the top layers are one global model, averaged as FedAvg averages a whole one — the reverse of
FedPer / FedAvg-SE, which share the body and keep the head.

Algorithm 1 (Section 3): each round the server sends the global layers θ^g; each participant
trains its local layers θ^l_m and the received θ^g together on its data (the paper's supervised
case: the cross-entropy of the whole model), keeps θ^l_m and uploads θ^g_m; the server averages
the θ^g_m. In raylf the global layers are the model's head and the local ones its encoder, so
bytes up and down are the head's size: for the bundled MLP and CNN a small fraction of the
model, the paper's point. The update is a ``FitPlan`` (cohort-trained); clients are scored with
their own encoder under the received head (the paper's "local test").

Where raylf follows PFLlib rather than the authors' code: training starts from the common
initialization, where the authors' scripts (``main_lg.py``) start every client from a FedAvg
model trained beforehand (400 to 800 rounds, ``--load_fed``) — run ``fedavg`` first and compare
against it for that protocol. The authors' code also picks each client's best local model on
its test split after every round; raylf never selects on test data. The global layers' mean
weights each client by its training size n_k (FedAvg's and PFLlib's; the authors' code takes
the plain mean, equal for equal sizes). The paper's "new test" (an ensemble of every client's
model on held-out devices) is not computed.
"""

from __future__ import annotations

from raylf.methods.base import FitPlan, Method, register
from raylf.methods.shared import PartSharing


@register
class LGFedAvg(PartSharing, Method):
    """LG-FedAvg: a private encoder per client under a shared, n_k-averaged head, trained
    together each round; only the head travels."""

    name = "lg_fedavg"
    shared = "head"
    averaged = frozenset({"head"})

    def plan(self, client):
        """The client's encoder and the received head trained together for the local epochs."""
        return FitPlan(self.model(client), self.split)
