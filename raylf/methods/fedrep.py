"""FedRep (Collins et al., ICML 2021, "Exploiting Shared Representations for Personalized Federated
Learning"): a representation (the body) learned together, a head per client; each round a
participant first fits its head on the received body, then the body under its new head.

The objective (Section 2, eq. 2) is min_φ (1/n) Σ_i min_{h_i} f_i(h_i ∘ φ). Algorithm 1, each
round t, for each participant i:

- head update: h_i^{t,s} = GRD(f_i(h_i^{t,s−1}, φ^t), h_i^{t,s−1}, α) for s = 1..τ_h, from the
  head the client kept, with the received body φ^t fixed;
- body update: φ_i^{t,s} = GRD(f_i(h_i^{t,τ_h}, φ_i^{t,s−1}), φ_i^{t,s−1}, α) for s = 1..τ, with
  the new head fixed;
- the server: φ^{t+1} = the mean of the φ_i^{t,τ}; heads never leave the clients.

The update is a two-stage ``FitPlan`` (``finish`` returning the body's plan), so participants
train in cohorts: ``head_epochs`` epochs of the head alone, shuffled by a stream of their own,
then the federation's local epochs of the body alone. Only the body goes up (bytes up: the
encoder). Clients are scored with the received body and their own head.

Where raylf follows the paper and PFLlib does not: the head's epochs default to the paper's 10
(Section 5 and its code's ``--local_ep 11 --local_rep_ep 1``: ten head epochs, one body epoch);
PFLlib's ``plocal_epochs`` default is 1. Shared with PFLlib and the authors' code, not written
in Algorithm 1: the server's mean weights each body by its client's training size n_k (the
algorithm writes the plain mean over participants; they coincide for equal sizes).
"""

from __future__ import annotations

from pydantic import Field

from raylf.methods.base import FitPlan, Method, MethodParams, register
from raylf.methods.shared import PartSharing


class FedRepParams(MethodParams):
    """Defaults from the paper's experiments (Section 5): 10 head epochs per round; the body's
    epochs are the federation's ``local_epochs`` (the paper's 1)."""

    head_epochs: int = Field(10, ge=1, description="τ_h: epochs of the head alone, the body "
                                                   "fixed at the received one, before the "
                                                   "body's epochs")


@register
class FedRep(PartSharing, Method):
    """FedRep: the head fitted on the received body, then the body under the new head; the body
    is n_k-averaged, the head stays on the client."""

    name = "fedrep"
    Params = FedRepParams
    shared = "encoder"
    averaged = frozenset({"encoder"})
    smoke_params = {"head_epochs": 1}

    def plan(self, client):
        """The head's fit (body frozen), then the body's (head frozen)."""

        def body_fit(with_new_head):
            return FitPlan(with_new_head, self.split, trainable=("encoder",))

        return FitPlan(self.model(client), body_fit, trainable=("head",),
                       epochs=self.params.head_epochs, seed_stream=(0,))
