"""FedAMP (Huang et al., AAAI 2021; methods.md D7): attentive message passing. The server keeps
every client's last uploaded model and sends each participant i its cloud model
u_i = Σ_j ξ_ij w_j, weighted towards the clients whose models are close to w_i; the client
trains from u_i with the proximal term (λ/(2α_k))·‖w − u_i‖², a squared norm that carries its
gradient (PFLlib's, built from ``.data`` with a plain norm, has none: it trains purely locally).

Attention: ξ_ij = α_k·A'(‖w_i − w_j‖²) for j ≠ i, A'(x) = e^{−x/σ}/σ; when the off-diagonal
weights sum past 1 they are scaled to sum to 1, so ξ_ii = 1 − Σ_{j≠i} ξ_ij ≥ 0 (methods.md
Decision). The squared distances come from the Gram matrix of the models (float64), so the
N² distances cost one (rows × N) product. Local training starts from u_i (Decision). Evaluated
with the personal model w_i (``personal``) and with the cloud model (``cloud``, ``_cloud``
columns).
"""

from __future__ import annotations

import torch
from pydantic import Field

from raylf.methods.base import ClientUpdate, FitPlan, Method, MethodParams, register, score


class FedAMPParams(MethodParams):
    """Defaults α_k = 1, λ = 1, σ = 1 (methods.md D7 and its quick table; PFLlib's defaults).
    σ should match the scale of squared distances between models, or every ξ_ij underflows."""

    alpha_k: float = Field(1.0, gt=0, description="attention step size α_k")
    lam: float = Field(1.0, ge=0, description="proximal strength λ (term λ/(2α_k)·‖w − u‖²)")
    sigma: float = Field(1.0, gt=0, description="attention scale σ in A'(x) = e^{-x/σ}/σ")


def attention_weights(models: torch.Tensor, rows: torch.Tensor, alpha_k: float,
                      sigma: float) -> torch.Tensor:
    """ξ (len(rows), N) for the clients ``rows`` over all N models; each row sums to 1, every
    entry ≥ 0."""
    m = models.double()
    sq = (m * m).sum(1)
    dist = (sq[rows, None] + sq[None, :] - 2 * m[rows] @ m.T).clamp(min=0)
    xi = alpha_k * torch.exp(-dist / sigma) / sigma
    own = (torch.arange(len(rows)), rows)
    xi[own] = 0
    xi = xi / xi.sum(1, keepdim=True).clamp(min=1)
    xi[own] = 1 - xi.sum(1)
    return xi


@register
class FedAMP(Method):
    name = "fedamp"
    Params = FedAMPParams
    personal_state = True
    deployables = ("personal", "cloud")

    def server_init(self, init):
        return {"models": init.expand(self.ctx.num_clients, -1).clone()}

    def broadcast(self, state, rnd):
        return {}

    def extras(self, state, client_ids):
        """Each client's cloud model u_i (participants in training, everyone at evaluation)."""
        rows = torch.as_tensor(client_ids, dtype=torch.long)
        p = self.params
        clouds = (attention_weights(state["models"], rows, p.alpha_k, p.sigma)
                  @ state["models"].double()).float()
        return {int(c): u for c, u in zip(client_ids, clouds)}

    def aggregate(self, state, uploads, rnd):
        models = state["models"].clone()
        models[torch.as_tensor(uploads.client_ids)] = uploads.tensors["model"]
        return {"models": models}, {}

    def client_init(self, cid, init):
        return init.clone()

    def plan(self, payload, personal, data, extra):
        p = self.params
        return FitPlan(extra, lambda trained: ClientUpdate({"model": trained}, trained),
                       anchor=extra, mu=p.lam / p.alpha_k)

    def deployable(self, payload, personal, extra):
        return personal

    def evaluate(self, trainer, payload, personal, data, extra, *, rnd, seed):
        rows = []
        for name, vector in zip(self.deployables, (personal, extra)):
            trainer.load(vector)
            rows.append(score(trainer.predict(data.x_test), data.y_test) | {"deployable": name})
        return rows
