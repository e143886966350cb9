"""Two tasks on the same inputs (FMT-SVM and its baselines): head layout, task losses, scoring.

Every client solves a ``binary`` task (labels 0/1) and a ``multiclass`` task (C classes). One
linear head serves both: its first columns score the binary task (one SVM score, or two softmax
logits), the next C columns score the classes. C is the ``multiclass`` task's own class count,
never the dataset's main label's: an npz whose ``y`` has 10 classes and whose ``y_multiclass``
has 3 gets a head of 1 + 3 columns, not 1 + 10 with seven columns no client ever sees as a
target (measured: those sized FMT-SVM's Σ 11×11 and kept it at chance).

Methods reuse this module through its functions and the ``TaskLoss`` they build from their
params; none inherits from another family for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from raylf.data.sources import SOURCES, load_source
from raylf.errors import SpecError
from raylf.methods.base import MethodParams
from raylf.models import SplitModel
from raylf.training.layout import ParamLayout

TASKS = ("binary", "multiclass")


# ---- losses (per-sample means) -----------------------------------------------------------------
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


# ---- the training objective ----------------------------------------------------------------
class MultiTaskParams(MethodParams):
    reduction: Literal["mean", "sum"] = Field(
        "mean", description="task losses over a minibatch: mean (the paper's objective, "
                            "per-sample means; chosen on validation data, see "
                            "raylf.methods.fmtsvm) or sum (its Algorithm 1 line 10, L_task = "
                            "Σ_j: batch_size times larger steps at the same lr, regularizers "
                            "batch_size times weaker against the data)")

    @property
    def task_weight(self) -> float:
        """The factor in front of the task losses (the SVM's C; 1 for softmax heads)."""
        return 1.0


FEATURE_RELU = ("false: features z = W_f·flatten + b_f, the paper's eq. 7 (the ReLU ending the "
                "cnn / mlp encoder is dropped); true: keep that ReLU, so the heads see only "
                "non-negative features")


class EncoderParams(MultiTaskParams):
    """For the methods with an encoder (FMT-SVM, FedPureCNN): the feature layer. Each method's
    default is the one its validation data favoured (evidence: ``raylf.methods.fmtsvm``)."""

    feature_relu: bool = Field(False, description=FEATURE_RELU)


def linear_features(model: SplitModel, method: str) -> SplitModel:
    """``model`` with the ReLU that ends its encoder removed (eq. 7's linear feature layer).

    Only encoders built as a sequence ending in Linear → ReLU (``cnn``, ``mlp``) have that
    ReLU; any other is refused rather than left silently unchanged. Refused here, not in
    ``Method.check``: the encoder's last layers are known once the model is built."""
    layers = list(model.encoder) if isinstance(model.encoder, nn.Sequential) else []
    if len(layers) < 2 or not isinstance(layers[-1], nn.ReLU) \
            or not isinstance(layers[-2], nn.Linear):
        raise SpecError([("method.params.feature_relu", (
            f"{method}'s linear features (eq. 7) drop the ReLU after the encoder's last Linear "
            f"layer (models cnn and mlp); this model's encoder does not end in one: use model "
            f"cnn, or set method.params.feature_relu: true to keep the encoder as built"))])
    model.encoder = model.encoder[:-1]
    return model


class SVMParams(MultiTaskParams):
    C: float = Field(1.0, gt=0, description="margin penalty: weight of the two hinge losses")

    @property
    def task_weight(self) -> float:
        return self.C


@dataclass(frozen=True)
class TaskLoss:
    """Both tasks' losses on a minibatch, per-sample means (× batch size for ``sum``) × weight.

    A frozen value, so two clients' plans with the same objective compare equal (cohorts)."""

    kind: HeadKind
    reduction: str
    weight: float = 1.0

    @classmethod
    def of(cls, kind: HeadKind, params: MultiTaskParams) -> TaskLoss:
        return cls(kind, params.reduction, params.task_weight)

    def __call__(self, outputs: torch.Tensor, targets: dict[str, torch.Tensor]) -> torch.Tensor:
        total = sum(self.kind.losses(outputs, targets).values())
        if self.reduction == "sum":
            total = total * len(outputs)
        return self.weight * total


# ---- head sizing ---------------------------------------------------------------------------
@cache
def _label_counts(dataset: str, params_json: str) -> dict[str, int]:
    """Classes per task label (max + 1), read once per process: the federation keeps only
    task names, and a worker builds its model before it holds any data."""
    source = load_source(dataset, SOURCES.get(dataset).Params.model_validate_json(params_json))
    return {task: int(labels.max()) + 1 if len(labels) else 0
            for task, labels in source.tasks.items()}


def multiclass_classes(method: str, federation) -> int:
    """C of the ``multiclass`` task, after checking the dataset has both tasks and 0/1 binary
    labels; every problem is a SpecError naming the dataset and the fix. Checked here, when the
    model is built, not in ``Method.check``: a dataset's tasks and labels are known once it is
    loaded (an npz names its own)."""
    missing = [t for t in TASKS if t not in federation.tasks]
    if missing:
        raise SpecError([("method.name", (
            f"{method} needs a multi-task dataset with tasks {', '.join(TASKS)}; dataset "
            f"{federation.dataset!r} lacks {', '.join(missing)} (use e.g. digits_multitask)"))])
    counts = _label_counts(federation.dataset, federation.dataset_params.model_dump_json())
    if counts["binary"] > 2:
        raise SpecError([("dataset", (
            f"{method}'s binary task needs labels 0/1; dataset {federation.dataset!r} has "
            f"labels up to {counts['binary'] - 1} in task 'binary' (in an npz: y_binary)"))])
    return counts["multiclass"]


def head_outputs(kind: HeadKind, method: str, federation) -> int:
    """Width of the head a method builds for this federation's two tasks."""
    return kind.width(multiclass_classes(method, federation))


def encoder_model(kind: HeadKind, method: str, spec_model, federation,
                  params: EncoderParams) -> SplitModel:
    """The spec's model with ``kind``'s head for the two tasks and, unless ``feature_relu``,
    the paper's linear feature layer (a method's ``build_model`` hook)."""
    model = spec_model(head_outputs(kind, method, federation))
    return model if params.feature_relu else linear_features(model, method)


def head_shape(layout: ParamLayout) -> tuple[int, int]:
    """(outputs, features) of the linear head, read off the model's parameter layout."""
    weight = next(s for s in layout.slots if s.name == "head.weight")
    return weight.shape[0], weight.shape[1]


# ---- scoring -------------------------------------------------------------------------------
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
