"""FedCE (Jiang et al., CVPR 2023, "Fair federated medical image segmentation via client
contribution estimation"): the global model moves by the participants' updates
weighted by each one's estimated contribution.

- Client (global model w_t, its coefficient c_k): from its second participation on, the minus
  model w̃_k = (w_t − c_k·w_k^prev)/(1 − c_k) (the global model without its last contribution)
  scored by accuracy on its *validation* split gives m_k; its data-space contribution is
  dc_k = 1 − mean(m history), its first participation storing 0 (the author's round 0). Then E
  epochs from w_t; it uploads Δ_k = w_k − w_t and dc_k, and keeps w_k as w_k^prev.
- Server: consensus g = Σ_j a_j Δ_j with a the participants' current coefficients renormalized;
  s_k = cos(Δ_k, g − a_k Δ_k) over the parameters (not buffers); gc_k = 1 − running mean of s_k
  over the rounds it took part in. gc and dc are normalized and floored, combined by ``mode``
  (plus: gc + dc, times: gc·dc), normalized and floored again into the new coefficients c, and
  w_{t+1} = w_t + Σ_k c_k Δ_k.

Decision — current coefficients everywhere: the reference assembler
keeps uniform ones for its consensus by a local-variable slip.
Decision — partial participation: a client's coefficient is its weight in the last aggregation
it took part in (the first: 1 / participants), so w_t = Σ c_j w_j^prev holds after a round and
the minus model removes exactly that client's term when it took part in the round before.
Normalizing "and clipping at ≥ floor" is one projection: entries below the floor are raised to
it and the rest rescaled, so the coefficients sum to 1 and none is below the floor.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from raylf.errors import SpecError
from raylf.methods.base import ClientUpdate, Deployment, Method, MethodParams, register


class FedCEParams(MethodParams):
    """Defaults: the NVFlare reference (``fedce_mode`` plus, coefficients clipped at 1e-3)."""

    mode: Literal["plus", "times"] = Field("plus", description="how gradient- and data-space "
                                                               "contributions combine")
    floor: float = Field(1e-3, gt=0, lt=0.5, description="least coefficient of a participant")


def floored(values: torch.Tensor, floor: float) -> torch.Tensor:
    """``values`` normalized to sum 1 with no entry below ``floor`` (uniform if ``floor``·n ≥ 1
    or nothing is positive): raise the small entries to the floor, rescale the rest, repeat."""
    n = len(values)
    v = values.double().clamp_min(0)
    if floor * n >= 1 or float(v.sum()) <= 0:
        return torch.full((n,), 1.0 / n, dtype=torch.float64)
    fixed = torch.zeros(n, dtype=torch.bool)
    while True:
        free = v.masked_fill(fixed, 0)
        c = torch.where(fixed, torch.full_like(v, floor),
                        free * (1 - floor * int(fixed.sum())) / free.sum().clamp_min(1e-300))
        low = (c < floor) & ~fixed
        if not low.any():
            return c
        fixed |= low


def coefficients(delta: torch.Tensor, current: torch.Tensor, dc: torch.Tensor,
                 history: tuple[torch.Tensor, torch.Tensor], mode: str, floor: float):
    """New coefficients of the participants (rows of ``delta``) and their updated histories of
    cosine scores (running sums, counts)."""
    a = current / current.sum()
    consensus = a @ delta
    minus = consensus[None, :] - a[:, None] * delta
    s = torch.nn.functional.cosine_similarity(delta, minus, dim=1)
    sums, counts = history[0] + s, history[1] + 1
    gc = floored(1 - sums / counts, floor)
    data = floored(dc, floor)
    combined = gc + data if mode == "plus" else gc * data
    return floored(combined, floor), (sums, counts)


@register
class FedCE(Method):
    name = "fedce"
    Params = FedCEParams
    personal_state = True
    evaluation = "shared"

    @classmethod
    def check(cls, spec, params):
        if spec.federation.participants_per_round() >= 2:
            return []
        return [("federation.participation", (
            "fedce needs at least 2 participants per round (a minus model leaves one out); "
            "raise federation.participation or federation.num_clients"))]

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.params_mask = ctx.layout.param_mask

    @classmethod
    def build_model(cls, spec_model, federation, params):
        """The spec's model, once the scenario is known to hold validation data: checked here,
        not in ``check``, because a dataset's split array can supply the validation split
        without ``scenario.val_fraction``, so only the built federation knows."""
        if not federation.has_val:
            raise SpecError([("scenario.val_fraction", (
                "fedce scores each client's minus model on its validation split; set "
                "scenario.val_fraction > 0 (e.g. 0.1)"))])
        return spec_model(federation.num_classes)

    # ---- server half -------------------------------------------------------------------------
    def server_init(self, init):
        n = self.ctx.num_clients
        return {"model": init.clone(),
                "coef": torch.full((n,), 1.0 / self.ctx.participants_per_round,
                                   dtype=torch.float64),
                "score_sum": torch.zeros(n, dtype=torch.float64),
                "score_count": torch.zeros(n, dtype=torch.float64)}

    def broadcast(self, state, rnd):
        return {"model": state["model"]}

    def extras(self, state, client_ids, rnd):
        return {int(c): float(state["coef"][c]) for c in client_ids}

    def aggregate(self, state, uploads, rnd):
        ids = torch.as_tensor(uploads.senders.get("delta", uploads.client_ids))
        delta = uploads.tensors["delta"].double()
        new, (sums, counts) = coefficients(
            delta[:, self.params_mask], state["coef"][ids], uploads.tensors["dc"][:, 0].double(),
            (state["score_sum"][ids], state["score_count"][ids]), self.params.mode,
            self.params.floor)
        coef, score_sum, score_count = (state[k].clone() for k in
                                        ("coef", "score_sum", "score_count"))
        coef[ids], score_sum[ids], score_count[ids] = new, sums, counts
        model = (state["model"].double() + new @ delta).float()
        return ({"model": model, "coef": coef, "score_sum": score_sum,
                 "score_count": score_count},
                {"coef_min": float(new.min()), "coef_max": float(new.max())})

    # ---- client half -------------------------------------------------------------------------
    def client_init(self, cid, init):
        return {"prev": init.clone(), "has_prev": False, "score_sum": 0.0, "score_count": 0}

    def local_update(self, client):
        """Score the minus model, then FedAvg's fit. Not a ``FitPlan`` (so not trained in
        cohorts): the score dc_k is the minus model's validation accuracy, which takes the
        trainer, and a plan is declared before the worker runs anything; the fit itself is
        ``LocalTrainer.fit``'s (``raylf.training.sgd``)."""
        trainer, data, personal = client.trainer, client.data, client.personal
        glob, c = client.payload["model"], client.extra
        total, count = personal["score_sum"], personal["score_count"] + 1
        if personal["has_prev"] and len(data.y_val):
            trainer.load((glob - c * personal["prev"]) / (1 - c))
            total += trainer.accuracy(data.x_val, data.y_val)
        elif personal["has_prev"]:
            count -= 1  # no validation sample: nothing to add to the history
        trainer.load(glob)
        trainer.fit(data.x_train, data.y_train, seed=client.seed)
        model = trainer.vector()
        dc = torch.tensor([1 - total / count], device=model.device)  # count ≥ 1: the first 0
        return ClientUpdate({"delta": model - glob, "dc": dc},
                            {"prev": model, "has_prev": True, "score_sum": total,
                             "score_count": count})

    def deploy(self, client):
        return Deployment({"main": client.payload["model"]})
