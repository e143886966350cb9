"""FedRoD (Chen and Chao, ICLR 2022, "On Bridging Generic and Personalized Federated Learning for
Image Classification"): one shared feature extractor with two heads on its features, a generic
head trained with a loss robust to the client's class imbalance and averaged by the server, and
a personal head that stays on the client and adds its logits to the generic head's.

Section 4 of the paper, the linear variant ("FedRoD (linear)"; the hypernetwork that predicts
the personal head is not built):

- the generic predictor, encoder θ and generic head ψ, minimizes the balanced risk, the
  balanced softmax of Ren et al. (NeurIPS 2020) over the client's label counts n_{i,c}:
  −log( n_{i,y} e^{g_y(x)} / Σ_c n_{i,c} e^{g_c(x)} ), i.e. the cross-entropy of the logits
  g(x) + log n_i; a class the client does not hold has weight 0 in the sum (log 0 = −∞);
- the personal head φ_i minimizes the client's empirical risk of the personalized prediction
  g(x) + p_i(x), trained on top of the generic predictor: its loss moves φ_i only (the
  features and the generic logits enter it as constants), as PFLlib's code has it;
- both losses step together at every local step, from the received (θ, ψ) and the kept φ_i;
  the server averages (θ, ψ) by n_k (FedAvg).

As a plan: the model's head is ``TwoHeads`` (ψ and φ_i side by side on the same features),
whose output is the personalized prediction with the stop-gradients above, so the plan's data
loss is the plain cross-entropy every client shares (cohorts compare ``loss_fn`` by identity);
the balanced softmax depends on the client's label counts, so it is a loss term
(``FitPlan.terms``) that reads the features and the generic head's parameters. Clients are
scored with the personalized model (``personal``) and the generic one (``generic``, the personal
head at zero: ``_generic`` columns). The personal head starts at zero, so the personalized
prediction starts as the generic one (raylf's choice: PFLlib starts it as a copy of the
generic head's initialization, which doubles the initial logits). PFLlib steps the two losses
with two plain SGD optimizers, raylf with the federation's optimizer over all the parameters:
under plain SGD the same steps, but gradient clipping takes one norm over both losses'
gradients here.

Checked on the bundled digits (the reported ``personal`` model): ``python -m raylf.run
tune/examples/digits_label_skew.yaml --backend local --out DIR --set seed=S --set
method.name=fedrod --set 'scenario={name: label_subset, k: 2, test_fraction: 0.25, val_fraction:
0.2}'`` (or ``{name: dirichlet, alpha: 0.1, …}``), seeds 0–2: 20 clients, half per round, 30
rounds, mlp [64], SGD lr 0.05 momentum 0.9, batch 16, one epoch; measured 2026-12-05.
Final-round test accuracy, mean over seeds × clients, and the paired difference over the 60
(seed, client) pairs with Wilcoxon's p (``raylf.stats.paired``); ``local`` 0.990 / 0.832 and
``fedavg`` 0.910 / 0.927 (2 classes / Dirichlet 0.1):

    2 classes      0.990, local +0.001 (p 0.69): ties local; fedavg +0.080 (p 9e-10): beats
    Dirichlet 0.1  0.919, local +0.086 (p 1e-5): beats local; fedavg −0.008 (p 0.13): ties
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from raylf.errors import SpecError
from raylf.methods.base import ClientUpdate, Deployment, FitPlan, Method, register
from raylf.methods.shared import averaged_model, global_model, send_model
from raylf.models import SplitModel
from raylf.training.objective import Batch

GENERIC = ("head.generic_weight", "head.generic_bias")


class TwoHeads(nn.Module):
    """A generic and a personal linear head on the same features. Its output, the
    personalized prediction g(z) + p(z), passes gradient to the personal head only: the
    generic logits and the features enter it detached, so the empirical risk of the
    personalized prediction trains p alone (the generic part is trained by its own loss)."""

    def __init__(self, generic: nn.Linear):
        super().__init__()
        self.generic_weight = nn.Parameter(generic.weight.detach().clone())
        self.generic_bias = nn.Parameter(generic.bias.detach().clone())
        self.personal_weight = nn.Parameter(torch.zeros_like(generic.weight))
        self.personal_bias = nn.Parameter(torch.zeros_like(generic.bias))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        generic = F.linear(features, self.generic_weight, self.generic_bias)
        personal = F.linear(features.detach(), self.personal_weight, self.personal_bias)
        return generic.detach() + personal


def balanced_softmax_loss(logits: torch.Tensor, labels: torch.Tensor,
                          counts: torch.Tensor) -> torch.Tensor:
    """The balanced softmax: the cross-entropy of ``logits`` + log ``counts`` (the client's
    samples per class; a class with none drops out of the normalizer)."""
    return F.cross_entropy(logits + counts.to(logits.dtype).log(), labels)


@register
class FedRoD(Method):
    name = "fedrod"
    personal_state = True  # the personal head φ_i
    averaged = frozenset({"model"})
    deployables = ("personal", "generic")

    @classmethod
    def build_model(cls, spec_model, federation, params):
        """The spec's encoder with ``TwoHeads`` in place of its linear head (the generic head
        keeps the factory's initialization)."""
        model = spec_model(federation.num_classes)
        if not isinstance(model.head, nn.Linear) or model.head.bias is None:
            raise SpecError([("model.name", (
                f"fedrod puts a personal linear head beside the model's head; this model's "
                f"head is {type(model.head).__name__}, not a linear layer with a bias"))])
        return SplitModel(model.encoder, TwoHeads(model.head), model.channels_last_on_cpu)

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        slots = {s.name: s for s in ctx.layout.slots}
        first = slots["head.personal_weight"]
        self.shared = slice(0, first.offset)  # encoder and generic head: (θ, ψ)
        self.personal = slice(first.offset, ctx.layout.size)

    # ---- server half: FedAvg of (θ, ψ) -------------------------------------------------------
    def server_init(self, init):
        return global_model(init[self.shared])

    def broadcast(self, state, rnd):
        return send_model(state)

    def aggregate(self, state, uploads, rnd):
        return averaged_model(uploads), {}

    # ---- client half ---------------------------------------------------------------------
    def client_init(self, cid, init):
        return init[self.personal].clone()  # zeros: TwoHeads starts the personal head there

    def plan(self, client):
        counts = torch.bincount(client.data.y_train, minlength=self.ctx.num_classes)
        weight, bias = GENERIC

        def balanced_risk(batch: Batch) -> torch.Tensor:
            generic = F.linear(batch.features, batch.params[weight], batch.params[bias])
            return balanced_softmax_loss(generic, batch.targets, counts.to(generic.device))

        def finish(trained):
            return ClientUpdate({"model": trained[self.shared]}, trained[self.personal].clone())

        return FitPlan(self.model(client), finish, terms=(balanced_risk,))

    def model(self, client) -> torch.Tensor:
        """The received (θ, ψ) with the client's personal head."""
        return torch.cat([client.payload["model"], client.personal])

    def deploy(self, client):
        generic = torch.cat([client.payload["model"], torch.zeros_like(client.personal)])
        return Deployment({"personal": self.model(client), "generic": generic})
