"""LG-FedAvg (Liang et al., 2020, "Think Locally, Act Globally: Federated Learning with Local and
Global Representations"): each client keeps its own lower layers (a local representation) and
the top layers are one global model, averaged as FedAvg averages a whole one — the reverse of
FedPer / FedAvg-SE, which share the body and keep the head.

The paper's algorithm: each round the server sends the global layers θ^g; each participant
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

Measured on 2026-12-05 on the bundled digits (20 clients, 30 rounds, in process): ``python -m
raylf.run tune/examples/digits_label_skew.yaml --backend local --out DIR --set
method.name=lg_fedavg --set seed=S --set scenario.val_fraction=0.15`` for S = 0, 1, 2, and the same
with ``--set 'scenario={name: dirichlet, alpha: 0.1, test_fraction: 0.25, val_fraction: 0.15}'``.
Final-round test accuracy over 3 seeds × 20 clients, and the paired difference with Wilcoxon's p
(``raylf.stats.paired``): 2-class split 0.991, against local +0.000 (p=0.99) and fedavg +0.082
(p<1e-8); Dirichlet 0.1 0.863, against local +0.014 (p=0.086) and fedavg −0.066 (p=0.31). Sharing
the head alone cannot carry what other clients learned of the classes a client rarely sees, which
Dirichlet 0.1 leaves it.
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
