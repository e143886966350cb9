"""FMT-SVM and its baselines FedPureCNN and FedPureSVM: two tasks per client (the paper "FMT-SVM: A
Communication-Efficient Federated Multi-Task Support Vector Machine Framework for Healthcare",
sections 2.3-2.11).

Every client solves a ``binary`` and a ``multiclass`` task on the same inputs; the head layout,
the task losses and per-task scoring live in ``raylf.methods.multitask``. For SVM heads column 0
is the binary score and columns 1..C the class scores, so W̃ = [w1 W2] and its biases are
exactly the ``head`` part of the flat vector — FMT-SVM's whole upload.

- FMT-SVM: private encoder (resident), heads restarted from W̃_global each round and trained with
  C·(hinges) + λ·tr(W̃Σ⁻¹W̃ᵀ) + μ·‖W̃ − W̃_global‖²_F; the server averages heads and re-estimates
  the task covariance Σ from their spread.
- FedPureCNN: the same CNN with softmax heads, whole model FedAvg-ed.
- FedPureSVM: the SVM heads on flattened pixels (no encoder), FedAvg of the heads.

Decision — loss scale (``reduction``, default ``mean``): the paper's objective (section 2)
averages each client's hinges over its samples; its Algorithm 1 (line 10) sums them over the
minibatch and adds λ·tr(·) and μ·‖·‖² once per step. A sum at lr η takes the hinge steps of a
mean at lr batch_size·η with λ and μ batch_size times weaker. The default follows the equation:
every other raylf method averages its loss, so with means the one optimizer of an experiment
gives every method the same step, and an lr that suits the others does not blow FMT-SVM up
(with sums the contract suite's lr 0.05, momentum 0.9 diverged, and so did lr 0.01 on the
stand-in). All three methods take the same ``reduction``. Chosen on validation data, never test
(final-round validation accuracy, mean of the two tasks; K 5, Dirichlet 0.5, R 10, standardized
inputs; 8×8 digits: val_fraction 0.2, 3 seeds; the stand-in digits28_multitask, ~1,400 training
images per client: val_fraction 0.1, 2 seeds; * one seed):

    E 5       FMT-SVM 8×8 / stand-in   FedPureCNN         FedPureSVM
    mean .03  0.916 / 0.940            0.903 / 0.971      0.865 / 0.652
    mean .05  0.932 / 0.940            0.940 / 0.974      0.866 / 0.690
    mean .1   0.944 / 0.900            0.954 / 0.967      0.877 / 0.620
    sum .003  0.933 / 0.956            0.955 / –          0.869 / 0.637*
    sum .01   0.926 / diverged         0.972* / diverged  0.854* / 0.694*

lr 0.05 is the most robust of the means for all three (the best worst case over the two data
sets); the sum at lr 0.003 ties with it for FMT-SVM (worst case 0.933) but diverges from lr 0.01
up. E 1 leaves every method undertrained (FMT-SVM at lr 0.1: 0.741 / 0.893) and E 10 gains
nothing on 8×8 (0.937 at lr 0.1), so the example spec runs E 5 at lr 0.05. With ``sum`` the
training loss the trainer records (and compares with ``federation.divergence_loss``) is the
minibatch sum; evaluation losses are per-sample means either way.

Decision — how the λ/μ terms are stepped (``penalty_step``, default ``proximal``): Algorithm 1
takes their gradient inside each SGD step. Σ is near-singular along the sum of the class
columns (the Weston–Watkins hinge cannot see that direction, so clients never disagree on it);
measured after round 1 at 28×28: smallest eigenvalue 2e-4 of trace 4, so the covariance term's
curvature 2λ/eig_min is ~1,000 at λ 0.1 and lr 0.01 oversteps it tenfold: one seed of three
diverged in round 2. The proximal step (SGD on the hinges, then the exact minimizer of the
quadratic terms around the result, a (1+C)×(1+C) solve) minimizes the same objective and is
stable for every λ of the paper's grid; ``gradient`` keeps Algorithm 1 literally.

Decision — the encoder's last layer (``feature_relu``): the paper's eq. 7 (section 2.5.3)
makes the features linear, z = W_f·flatten + b_f; the ``cnn`` model ends its encoder in a ReLU,
which would show the SVM heads only non-negative features. ``feature_relu: false`` drops that
ReLU. Chosen per method on validation data (final-round validation accuracy of the reported
model, binary / multiclass; digits28_multitask, K 5, Dirichlet 0.5, E 2, R 5 — shortened from
E 5, R 10 to fit the compute budget — lr 0.05, val_fraction 0.1, seed 0):

                     eq. 7 (linear)    ReLU
    FMT-SVM          0.911 / 0.850     0.895 / 0.843
    FedPureCNN       0.898 / 0.879     0.952 / 0.930

FMT-SVM keeps the paper's linear features (the ReLU is no better); FedPureCNN's softmax heads
learn clearly better behind the ReLU (without it the encoder's last Linear and the head
compose into one linear map), so its default keeps the ReLU and eq. 7 is
``feature_relu: false``. FedPureSVM has no encoder. With DP noise on the heads the unbounded
linear features blow up unless gradients are clipped (8×8, ε 1, lr 0.05: loss 8e14 in round 2;
clipped at norm 1, 3 of 3 seeds run 10 rounds), so ``tune/fmtsvm_dp.yaml`` clips them.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from raylf.methods.base import ClientUpdate, Deployment, FitPlan, Method, register
from raylf.methods.multitask import (
    FEATURE_RELU,
    SOFTMAX,
    SVM,
    EncoderParams,
    SVMParams,
    TaskLoss,
    encoder_model,
    head_outputs,
    head_shape,
    task_rows,
)
from raylf.methods.privacy import DPParams, privatize, round_accounting
from raylf.methods.shared import GlobalModelServer, upload_model
from raylf.models import SplitModel
from raylf.seeding import client_seed, derive


# ---- server arithmetic -------------------------------------------------------------------------
def task_covariance(weights: torch.Tensor, eps: float, normalize: bool) -> torch.Tensor:
    """Σ = (1/N) Σ_k Z_kᵀZ_k + εI with Z_k = W̃_k − W̄, over stacked head weights (N, 1+C, d).

    ``normalize`` rescales Σ to trace 1+C (raylf's reading), keeping Σ⁻¹ of order one.
    """
    z = weights - weights.mean(0)
    width = weights.shape[1]
    sigma = torch.einsum("nid,njd->ij", z, z) / len(weights)
    sigma = sigma + eps * torch.eye(width, dtype=sigma.dtype)
    return sigma * (width / sigma.trace()) if normalize else sigma


def covariance_penalty(weight: torch.Tensor, sigma_inv: torch.Tensor) -> torch.Tensor:
    """tr(W̃Σ⁻¹W̃ᵀ) for W̃ = weightᵀ (the Linear's weight is (1+C) × d)."""
    return (sigma_inv * (weight @ weight.T)).sum()


def penalty_prox(sigma_inv: torch.Tensor, anchor: torch.Tensor, lam: float, mu: float,
                 lr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The proximal map of η·(λ·tr(WΣ⁻¹Wᵀ) + μ·‖W − A‖²) as W ↦ shrink @ W + pull.

    Setting the gradient of ½‖W − V‖² + η·penalty to zero gives
    ((1 + 2ημ)I + 2ηλΣ⁻¹) W = V + 2ημA. Why not plain SGD on the penalty (Algorithm 1): its
    curvature is 2λ/eig_min(Σ), and Σ is near-singular along the sum of the class columns (the
    Weston–Watkins hinge is blind to it, so clients never disagree there), so a gradient step
    with η·2λ/eig_min > 2 diverges; the proximal step solves the same objective at any λ.
    """
    width = sigma_inv.shape[0]
    eye = torch.eye(width, dtype=sigma_inv.dtype, device=sigma_inv.device)
    system = (1 + 2 * lr * mu) * eye + 2 * lr * lam * sigma_inv
    shrink = torch.linalg.inv(system)
    return shrink, shrink @ (2 * lr * mu * anchor)


# ---- methods -----------------------------------------------------------------------------------
class FedPureCNNParams(EncoderParams):
    """feature_relu true by default: the validation evidence in the module docstring."""

    feature_relu: bool = Field(True, description=FEATURE_RELU)


@register
class FedPureCNN(GlobalModelServer, Method):
    """FedAvg of the whole CNN with softmax heads for both tasks (cross-entropy on each)."""

    name = "fed_pure_cnn"
    Params = FedPureCNNParams
    kind = SOFTMAX
    requires = frozenset({"tasks"})
    targets = "tasks"
    evaluation = "shared"

    @classmethod
    def build_model(cls, spec_model, federation, params) -> SplitModel:
        """The spec's model with one head for both tasks (Blueprint's model hook)."""
        return encoder_model(cls.kind, cls.name, spec_model, federation, params)

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.loss = TaskLoss.of(self.kind, params)

    def plan(self, client):
        return FitPlan(client.payload["model"], upload_model, loss_fn=self.loss,
                       targets="tasks")

    def deploy(self, client):
        return Deployment({"main": client.payload["model"]})

    def scores(self, outputs, targets):
        """One row per task: accuracy, AUC and loss (``raylf.methods.multitask``)."""
        return task_rows(self.kind, outputs, targets)


@register
class FedPureSVM(FedPureCNN):
    """The two SVM heads on flattened raw pixels; the model is the heads, FedAvg-ed."""

    name = "fed_pure_svm"
    Params = SVMParams
    kind = SVM

    @classmethod
    def build_model(cls, spec_model, federation, params) -> SplitModel:
        features = math.prod(federation.input_shape)
        return SplitModel(nn.Flatten(),
                          nn.Linear(features, head_outputs(cls.kind, cls.name, federation)))


class FMTSVMParams(SVMParams, EncoderParams):
    lam: float = Field(0.1, ge=0, description="task-covariance strength λ")
    mu: float = Field(0.01, ge=0, description="consensus strength μ towards W̃_global")
    eps_cov: float = Field(1e-3, gt=0, description="ε added to Σ's diagonal")
    sigma_norm: Literal["trace", "none"] = Field(
        "trace", description="trace: rescale Σ to trace 1+C; none: the paper read literally")
    penalty_step: Literal["proximal", "gradient"] = Field(
        "proximal", description="proximal: SGD on the hinges, then the exact minimizer of the "
                                "quadratic λ/μ terms around the step (stable for any λ, μ); "
                                "gradient: the penalties' gradient in the SGD step (Algorithm 1)")
    encoder_sync_every: int | None = Field(
        None, ge=1, description="average encoders every this many rounds; null = never")
    dp: DPParams = Field(default_factory=DPParams,
                         description="differential privacy of each uploaded head (local DP: "
                                     "clipping, Gaussian noise); off unless dp.epsilon is set")

    @model_validator(mode="after")
    def _dp_covers_heads_only(self):
        if self.dp.enabled and self.encoder_sync_every is not None:
            raise ValueError("dp noises the heads only; encoder_sync_every would upload "
                             "encoders without noise — use one or the other")
        return self


@register
class FMTSVM(Method):
    """Private encoders, shared SVM heads coupled by a learned task covariance Σ."""

    name = "fmtsvm"
    Params = FMTSVMParams
    proposed_in = ("FMT-SVM: A Communication-Efficient Federated Multi-Task Support Vector "
                   "Machine Framework for Healthcare")
    personal_state = True
    requires = frozenset({"tasks"})
    targets = "tasks"
    averaged = frozenset({"encoder"})  # heads stay per client: Σ needs their spread
    deployables = ("global_heads", "own_heads")  # the paper's model first

    @classmethod
    def build_model(cls, spec_model, federation, params) -> SplitModel:
        """The spec's model (the paper's CNN encoder) with the 1 + C SVM head columns."""
        return encoder_model(SVM, cls.name, spec_model, federation, params)

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.loss = TaskLoss.of(SVM, params)
        self.width, self.features = head_shape(ctx.layout)

    # ---- server half ---------------------------------------------------------------------
    def server_init(self, init):
        return {"heads": init[self.ctx.layout.part("head")].clone(),
                "sigma": torch.eye(self.width)}

    def broadcast(self, state, rnd):
        """Heads + Σ; after an encoder-sync round also the averaged encoder."""
        payload = {"heads": state["heads"], "sigma": state["sigma"]}
        if "encoder" in state:
            payload["encoder"] = state["encoder"]
        return payload

    def extras(self, state, client_ids, rnd):
        """In sync rounds, ask the participants to upload their encoders as well."""
        every = self.params.encoder_sync_every
        if every is None or rnd % every:
            return {}
        return {int(c): True for c in client_ids}

    def aggregate(self, state, uploads, rnd):
        heads = uploads.tensors["heads"]
        p = self.params
        sigma = task_covariance(self.weights(heads), p.eps_cov, p.sigma_norm == "trace")
        new = {"heads": uploads.mean("heads"), "sigma": sigma}
        if "encoder" in uploads:
            new["encoder"] = uploads.mean("encoder")
        diagnostics = {f"sigma_eig_{i}": float(v)
                       for i, v in enumerate(torch.linalg.eigvalsh(sigma))}
        if p.dp.enabled:
            diagnostics.update(round_accounting(p.dp, rnd))
        return new, diagnostics

    def weights(self, heads: torch.Tensor) -> torch.Tensor:
        """Head vectors (…, P) → their weight matrices (…, 1+C, d), biases dropped."""
        size = self.width * self.features
        return heads[..., :size].reshape(*heads.shape[:-1], self.width, self.features)

    # ---- client half ---------------------------------------------------------------------
    def client_init(self, cid, init):
        return {"encoder": init[self.ctx.layout.part("encoder")].clone(),
                "heads": init[self.ctx.layout.part("head")].clone()}

    def plan(self, client):
        """Own encoder (or the synced one) and the global heads, trained on the hinges with the
        λ/μ terms stepped as ``penalty_step`` says: in the loss (a loss term) or as the exact
        proximal map after every step (``after_step``); the heads (noised under DP) go up."""
        payload, personal = client.payload, client.personal
        p = self.params
        sigma_inv = torch.linalg.inv(payload["sigma"])
        anchor = self.weights(payload["heads"])
        layout = self.ctx.layout
        noise_seed = derive(client_seed(self.ctx.seed, client.rnd, client.cid), "method")

        def finish(trained: torch.Tensor) -> ClientUpdate:
            own = {"encoder": trained[layout.part("encoder")].clone(),
                   "heads": trained[layout.part("head")].clone()}
            upload = {"heads": own["heads"]}
            if p.dp.enabled:
                upload["heads"] = privatize(own["heads"], p.dp, noise_seed)
            if client.extra:
                upload["encoder"] = own["encoder"]
            return ClientUpdate(upload, own)

        start = torch.cat([payload.get("encoder", personal["encoder"]), payload["heads"]])
        if p.penalty_step == "gradient":
            def penalty(batch) -> torch.Tensor:
                w = batch.params["head.weight"]
                return p.lam * covariance_penalty(w, sigma_inv) + p.mu * (w - anchor).pow(2).sum()

            return FitPlan(start, finish, loss_fn=self.loss, targets="tasks", terms=(penalty,))
        prox_map = cache(lambda lr: penalty_prox(sigma_inv, anchor, p.lam, p.mu, lr))

        def after_step(params, lr) -> dict[str, torch.Tensor]:
            shrink, pull = prox_map(lr)
            return {"head.weight": shrink @ params["head.weight"] + pull}

        return FitPlan(start, finish, loss_fn=self.loss, targets="tasks", after_step=after_step)

    def deploy(self, client):
        """Own encoder (or the freshly synced one) with the global heads, the paper's model,
        and with the client's own heads."""
        encoder = client.payload.get("encoder", client.personal["encoder"])
        return Deployment({"global_heads": torch.cat([encoder, client.payload["heads"]]),
                           "own_heads": torch.cat([encoder, client.personal["heads"]])})

    def scores(self, outputs, targets):
        """One row per task: accuracy, AUC and loss (``raylf.methods.multitask``)."""
        return task_rows(SVM, outputs, targets)
