"""FMT-SVM (methods.md C) and its baselines FedPureCNN and FedPureSVM: two tasks per client.

Every client solves a ``binary`` and a ``multiclass`` task on the same inputs (the dataset's main
label is the multi-class task, so C = num_classes). One linear head serves both tasks: for SVM
heads its column 0 is the binary score and columns 1..C the class scores, so W̃ = [w1 W2] and its
biases are exactly the ``head`` part of the flat vector — FMT-SVM's whole upload. Softmax heads
(FedPureCNN) use two logit columns for the binary task instead of one score.

- FMT-SVM: private encoder (resident), heads restarted from W̃_global each round and trained with
  C·(hinges) + λ·tr(W̃Σ⁻¹W̃ᵀ) + μ·‖W̃ − W̃_global‖²_F; the server averages heads and re-estimates
  the task covariance Σ from their spread.
- FedPureCNN: the same CNN with softmax heads, whole model FedAvg-ed.
- FedPureSVM: the SVM heads on flattened pixels (no encoder), FedAvg of the heads.

Decision — loss reduction over a minibatch (``reduction``, default ``sum``): the paper's
Algorithm 1 line 10 is explicit, L_task = Σ_j (L_j⁽¹⁾ + L_j⁽²⁾), a *sum* over the minibatch,
while the regularizers (lines 11–12) are added once per step. methods.md writes the hinges as
means; the paper is the authority here, so ``sum`` is the default and ``mean`` stays an option.
The choice matters: with a mean the per-sample hinges weigh 1/batch_size as much against
λ·tr(·) and μ·‖·‖², and at the same lr each step moves the weights batch_size times less (ten
rounds of E = 1 leave every method undertrained). For a fair comparison all three methods take
the same ``reduction``: FedPureSVM sums (or averages) the very same hinges, FedPureCNN its two
cross-entropies; with the optimizer identical across methods (methods.md conventions).
With ``sum`` the training loss the trainer records (and compares with
``federation.divergence_loss``) is the minibatch sum, batch_size times the per-sample value;
evaluation losses stay per-sample means. Steps are batch_size times larger at the same lr, so
runs that are noisy anyway (DP on the heads) can blow up where ``mean`` would not.

Decision — how the λ/μ terms are stepped (``penalty_step``, default ``proximal``): Algorithm 1
takes their gradient inside each SGD step. Σ is near-singular along the sum of the class
columns (the Weston–Watkins hinge cannot see that direction, so clients never disagree on it);
measured after round 1 at 28×28: smallest eigenvalue 2e-4 of trace 4, so the covariance term's
curvature 2λ/eig_min is ~1,000 at λ 0.1 and lr 0.01 oversteps it tenfold: one seed of three
diverged in round 2. The proximal step (SGD on the hinges, then the exact minimizer of the
quadratic terms around the result, a (1+C)×(1+C) solve) minimizes the same objective and is
stable for every λ of the paper's grid; ``gradient`` keeps Algorithm 1 literally.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from raylf.errors import SpecError
from raylf.methods.base import ClientUpdate, FitPlan, Method, MethodParams, register
from raylf.methods.fedavg import FedAvg
from raylf.models import SplitModel
from raylf.privacy import DPParams, privatize, round_report
from raylf.seeding import derive

TASKS = ("binary", "multiclass")


# ---- losses ------------------------------------------------------------------------------------
def binary_hinge(score: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """mean max(0, 1 − y·s) with labels {0, 1} read as {−1, +1}."""
    return F.relu(1 - (2 * y - 1) * score).mean()


def logistic(score: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of two softmax logits written through their difference s = l1 − l0."""
    return F.softplus(-(2 * y - 1) * score).mean()


def multiclass_hinge(scores: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """mean_i Σ_{j≠y_i} max(0, 1 + s_ij − s_iy_i) (Weston–Watkins, the paper's Algorithm 1)."""
    margins = F.relu(1 + scores - scores.gather(1, y[:, None]))
    return margins.masked_fill(F.one_hot(y, scores.shape[1]).bool(), 0).sum(1).mean()


@dataclass(frozen=True)
class HeadKind:
    """How the head's output columns map to the two tasks, and each task's loss."""

    binary_columns: int  # 1: an SVM score; 2: softmax logits
    binary_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    multiclass_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    def width(self, classes: int) -> int:
        return self.binary_columns + classes

    def scores(self, outputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Decision scores per task: one binary score (> 0 means positive), C class scores."""
        b = self.binary_columns
        binary = outputs[:, 0] if b == 1 else outputs[:, 1] - outputs[:, 0]
        return {"binary": binary, "multiclass": outputs[:, b:]}

    def losses(self, outputs: torch.Tensor, targets: dict[str, torch.Tensor]) -> dict[str, Any]:
        s = self.scores(outputs)
        return {"binary": self.binary_loss(s["binary"], targets["binary"]),
                "multiclass": self.multiclass_loss(s["multiclass"], targets["multiclass"])}


SVM = HeadKind(1, binary_hinge, multiclass_hinge)
SOFTMAX = HeadKind(2, logistic, F.cross_entropy)


# ---- server arithmetic -------------------------------------------------------------------------
def task_covariance(weights: torch.Tensor, eps: float, normalize: bool) -> torch.Tensor:
    """Σ = (1/N) Σ_k Z_kᵀZ_k + εI with Z_k = W̃_k − W̄, over stacked head weights (N, 1+C, d).

    ``normalize`` rescales Σ to trace 1+C (methods.md Decision), keeping Σ⁻¹ of order one.
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


# ---- evaluation --------------------------------------------------------------------------------
def auc(y: np.ndarray, scores: np.ndarray) -> float | None:
    """ROC AUC from decision scores; multi-class = macro one-vs-rest over the classes present.

    A test split holding one class has no AUC (None), rather than an error or a fake 0.5.
    """
    from sklearn.metrics import roc_auc_score  # here: keeps scipy out of every worker's import

    present = np.unique(y)
    if len(present) < 2:
        return None
    if scores.ndim == 1:
        return float(roc_auc_score(y, scores))
    return float(np.mean([roc_auc_score(y == c, scores[:, c]) for c in present]))


def task_rows(kind: HeadKind, outputs: torch.Tensor,
              targets: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """One clients-table row per task: n_test, correct, accuracy, auc, loss."""
    scores, losses = kind.scores(outputs), kind.losses(outputs, targets)
    rows = []
    for task in TASKS:
        y, s = targets[task], scores[task]
        n = len(y)
        pred = (s > 0).long() if s.ndim == 1 else s.argmax(1)
        correct = int((pred == y).sum())
        rows.append({"task": task, "n_test": n, "correct": correct,
                     "accuracy": correct / n if n else None,
                     "auc": auc(y.cpu().numpy(), s.cpu().numpy()) if n else None,
                     "loss": float(losses[task]) if n else None})
    return rows


def require_tasks(method: str, federation) -> None:
    missing = [t for t in TASKS if t not in federation.tasks]
    if missing:
        raise SpecError([("method.name", (
            f"{method} needs a multi-task dataset with tasks {', '.join(TASKS)}; dataset "
            f"{federation.dataset!r} lacks {', '.join(missing)} (use e.g. digits_multitask)"))])


# ---- methods -----------------------------------------------------------------------------------
class MultiTaskParams(MethodParams):
    reduction: Literal["sum", "mean"] = Field(
        "sum", description="task losses over a minibatch: sum (the paper's Algorithm 1 line 10, "
                           "L_task = Σ_j) or mean (batch_size times smaller steps at the same "
                           "lr, and regularizers batch_size times stronger relative to the data)")


class SVMParams(MultiTaskParams):
    C: float = Field(1.0, gt=0, description="margin penalty: weight of the two hinge losses")


class MultiTask(Method):
    """Shared by the three: the model hook, the two-task objective and per-task evaluation."""

    Params = MultiTaskParams
    kind: HeadKind = SOFTMAX
    requires = frozenset({"tasks"})

    @classmethod
    def build_model(cls, spec_model: Callable[[int], SplitModel], federation) -> SplitModel:
        """The spec's model with a head of ``kind.width(C)`` columns (Blueprint's model hook)."""
        require_tasks(cls.name, federation)
        return spec_model(cls.kind.width(federation.num_classes))

    def loss(self, outputs: torch.Tensor, targets: dict[str, torch.Tensor]) -> torch.Tensor:
        """Both tasks' losses (means per sample), × batch size for ``reduction: sum``, × C."""
        total = sum(self.kind.losses(outputs, targets).values())
        if self.params.reduction == "sum":
            total = total * len(outputs)
        return self.params.C * total if isinstance(self.params, SVMParams) else total

    def fit(self, trainer, data, seed: int, **regularizer):
        targets = {t: data.tasks_train[t] for t in TASKS}
        return trainer.fit(data.x_train, targets, seed=seed, loss_fn=self.loss, **regularizer)

    def rows(self, trainer, vector: torch.Tensor, data) -> list[dict[str, Any]]:
        trainer.load(vector)
        return task_rows(self.kind, trainer.predict(data.x_test), data.tasks_test)

    def evaluate(self, trainer, payload, personal, data, extra, *, rnd, seed):
        return self.rows(trainer, self.deployable(payload, personal, extra), data)


@register
class FedPureCNN(MultiTask, FedAvg):
    """FedAvg of the whole CNN with softmax heads for both tasks (cross-entropy on each)."""

    name = "fed_pure_cnn"
    Params = MultiTaskParams
    shared_deployable = False  # rows per task, not the single-task shared evaluation

    def plan(self, payload, personal, data, extra):
        return FitPlan(payload["model"], lambda trained: ClientUpdate({"model": trained}),
                       loss_fn=self.loss, targets="tasks")


@register
class FedPureSVM(FedPureCNN):
    """The two SVM heads on flattened raw pixels; the model is the heads, FedAvg-ed."""

    name = "fed_pure_svm"
    Params = SVMParams
    kind = SVM

    @classmethod
    def build_model(cls, spec_model, federation):
        require_tasks(cls.name, federation)
        features = math.prod(federation.input_shape)
        return SplitModel(nn.Flatten(), nn.Linear(features, cls.kind.width(federation.num_classes)))


class FMTSVMParams(SVMParams):
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
    dp: DPParams = Field(default_factory=DPParams)

    @model_validator(mode="after")
    def _dp_covers_heads_only(self):
        if self.dp.enabled and self.encoder_sync_every is not None:
            raise ValueError("dp noises the heads only; encoder_sync_every would upload "
                             "encoders without noise — use one or the other")
        return self


@register
class FMTSVM(MultiTask):
    """Private encoders, shared SVM heads coupled by a learned task covariance Σ."""

    name = "fmtsvm"
    Params = FMTSVMParams
    kind = SVM
    personal_state = True
    averaged = frozenset({"encoder"})  # heads stay per client: Σ needs their spread
    deployables = ("global_heads", "own_heads")  # the paper's model first

    # ---- server half ---------------------------------------------------------------------
    def server_init(self, init):
        width = self.kind.width(self.ctx.num_classes)
        return {"heads": init[self.ctx.layout.part("head")].clone(),
                "sigma": torch.eye(width), "round": 0}

    def broadcast(self, state, rnd):
        """Heads + Σ; after an encoder-sync round also the averaged encoder."""
        payload = {"heads": state["heads"], "sigma": state["sigma"]}
        if "encoder" in state:
            payload["encoder"] = state["encoder"]
        return payload

    def extras(self, state, client_ids):
        """In sync rounds, ask the participants to upload their encoders as well."""
        every = self.params.encoder_sync_every
        if every is None or (state["round"] + 1) % every:
            return {}
        return {int(c): True for c in client_ids}

    def aggregate(self, state, uploads, rnd):
        heads = uploads.tensors["heads"]
        p = self.params
        sigma = task_covariance(self.weights(heads), p.eps_cov, p.sigma_norm == "trace")
        new = {"heads": uploads.mean("heads"), "sigma": sigma, "round": rnd}
        if "encoder" in uploads:
            new["encoder"] = uploads.mean("encoder")
        diagnostics = {f"sigma_eig_{i}": float(v)
                       for i, v in enumerate(torch.linalg.eigvalsh(sigma))}
        if p.dp.enabled:
            diagnostics.update(round_report(p.dp, rnd))
        return new, diagnostics

    def weights(self, heads: torch.Tensor) -> torch.Tensor:
        """Head vectors (…, P) → their weight matrices (…, 1+C, d), biases dropped."""
        width = self.kind.width(self.ctx.num_classes)
        d = heads.shape[-1] // width - 1
        return heads[..., : width * d].reshape(*heads.shape[:-1], width, d)

    # ---- client half ---------------------------------------------------------------------
    def client_init(self, cid, init):
        return {"encoder": init[self.ctx.layout.part("encoder")].clone(),
                "heads": init[self.ctx.layout.part("head")].clone()}

    def local_update(self, trainer, payload, personal, data, seed, extra):
        trainer.load(payload.get("encoder", personal["encoder"]), "encoder")
        trainer.load(payload["heads"], "head")
        sigma_inv = torch.linalg.inv(payload["sigma"])
        anchor = self.weights(payload["heads"])
        p = self.params
        w = trainer.model.head.weight
        if p.penalty_step == "gradient":
            def penalty() -> torch.Tensor:
                return p.lam * covariance_penalty(w, sigma_inv) + p.mu * (w - anchor).pow(2).sum()

            self.fit(trainer, data, seed, penalty=penalty)
        else:
            shrink, pull = penalty_prox(sigma_inv, anchor, p.lam, p.mu, trainer.opt_cfg.lr)
            self.fit(trainer, data, seed, after_step=lambda: w.copy_(shrink @ w + pull))
        own = {"encoder": trainer.vector("encoder"), "heads": trainer.vector("head")}
        upload = {"heads": own["heads"]}
        if p.dp.enabled:
            upload["heads"] = privatize(own["heads"], p.dp, derive(seed, "method"))
        if extra:
            upload["encoder"] = own["encoder"]
        return ClientUpdate(upload, own)

    def deployable(self, payload, personal, extra):
        """Own encoder (or the freshly synced one) with the global heads: the paper's model."""
        return torch.cat([payload.get("encoder", personal["encoder"]), payload["heads"]])

    def evaluate(self, trainer, payload, personal, data, extra, *, rnd, seed):
        """Rows per task for (own encoder, global heads) and for (own encoder, own heads)."""
        shared = self.rows(trainer, self.deployable(payload, personal, extra), data)
        encoder = payload.get("encoder", personal["encoder"])
        own = self.rows(trainer, torch.cat([encoder, personal["heads"]]), data)
        return [row | {"deployable": name}
                for name, rows in zip(self.deployables, (shared, own)) for row in rows]
