"""MOON (Li, He and Song, CVPR 2021, "Model-Contrastive Federated Learning"): FedAvg whose local
objective adds a contrastive term on representations, pulling each sample's representation
towards the one the received global model gives it and away from the one the client's previous
local model gave it.

Section 3.3 of the paper: with z, z_glob and z_prev the representations of x by the model being
trained, the received global model w^t and the client's previous local model w_i^{t−1},

    ℓ_con = −log( e^{sim(z, z_glob)/τ} / (e^{sim(z, z_glob)/τ} + e^{sim(z, z_prev)/τ}) ),

sim the cosine similarity, and the local loss is ℓ = ℓ_sup + μ·ℓ_con (Algorithm 1: local
epochs on it from w^t, the trained model uploaded and kept as the next round's w_i^{t−1}; the
server averages by n_k as FedAvg). The term reads the features of two frozen reference models
(``FitPlan.references``: ``global`` and ``previous``), so MOON is a plan and trains in cohorts.

The representation is the encoder's output (the features the head reads), as PFLlib's MOON
takes the model's base output; the paper's networks end their encoder with a projection head
(two layers to 256 dimensions) that raylf's models do not have, so it is not added. A client's
previous local model before its first participation is the common initialization (PFLlib's
choice too; the paper's round 1 has every client start there). Evaluation: the global model
(``global``, MOON's model), and each client's last trained local model (``local``,
``_local`` columns).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from raylf.methods.base import ClientUpdate, Deployment, FitPlan, Method, MethodParams, register
from raylf.methods.shared import GlobalModelServer
from raylf.training.objective import Batch


class MOONParams(MethodParams):
    """Defaults: τ = 0.5 (the paper's, every dataset). μ: the paper tunes it in
    {0.1, 1, 5, 10} and takes 5 on CIFAR-10, 1 on CIFAR-100 and Tiny-ImageNet; 1 here, chosen on
    validation data (see the module's recorded figures)."""

    mu: float = Field(1.0, ge=0, description="weight μ of the model-contrastive term "
                                             "(ℓ = ℓ_sup + μ·ℓ_con)")
    temperature: float = Field(0.5, gt=0, description="temperature τ of the similarities")


def model_contrastive_loss(z: torch.Tensor, z_global: torch.Tensor, z_previous: torch.Tensor,
                           temperature: float) -> torch.Tensor:
    """ℓ_con averaged over a batch: the cross-entropy of the two similarities (positive: the
    global model's representation, negative: the previous local model's) over τ, the positive
    being the class; representations are flattened per sample."""
    z = z.flatten(1)
    positive = F.cosine_similarity(z, z_global.flatten(1), dim=1)
    negative = F.cosine_similarity(z, z_previous.flatten(1), dim=1)
    logits = torch.stack([positive, negative], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


@register
class MOON(GlobalModelServer, Method):
    name = "moon"
    Params = MOONParams
    personal_state = True  # the previous local model w_i^{t-1}
    deployables = ("global", "local")

    def client_init(self, cid, init):
        return init.clone()

    def plan(self, client):
        received = client.payload["model"]
        mu, tau = self.params.mu, self.params.temperature

        def contrastive(batch: Batch) -> torch.Tensor:
            return mu * model_contrastive_loss(batch.features,
                                               batch.references["global"].features,
                                               batch.references["previous"].features, tau)

        return FitPlan(received, lambda trained: ClientUpdate({"model": trained}, trained),
                       terms=(contrastive,),
                       references={"global": received, "previous": client.personal})

    def deploy(self, client):
        return Deployment({"global": client.payload["model"], "local": client.personal})
