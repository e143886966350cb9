"""The open part of a local objective: loss terms that see a training step's batch, the model's
features and outputs on it, the client's parameters, and frozen reference models.

A local fit minimizes the data loss (``loss_fn`` of the outputs and targets, the loss the
trainers log) plus the sum of its ``terms``, each a function of one ``Batch``. That covers the
objectives of personalized FL beyond a pull towards a vector: a penalty on the parameters
(FMT-SVM's task covariance), distillation towards a frozen model's outputs (FedKD), a
contrastive term between the features and those of the global and the previous local model
(MOON), a prototype term between the features and the received class prototypes (FedProto).
A reference model is a flat vector the fit does not train (``references`` by name): the
trainers run it on the same batch, without gradients and in eval mode, and hand a term its
``Forward``.

Both trainers call the same terms with the same ``Batch`` of one client: the sequential one
from its model, the cohort one from each member's rows of the stacked forward pass, so a term
written once is cohort-trained, and its gradient is a client's own by construction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call


@dataclass(frozen=True)
class Forward:
    """A model's features (the encoder's output) and outputs (the head's) on a batch."""

    features: torch.Tensor
    outputs: torch.Tensor


@dataclass(frozen=True)
class Batch:
    """What a loss term sees at one step of one client's fit: the inputs ``x`` and ``targets``
    of the minibatch, the trained model's ``features`` and ``outputs`` on it (they carry the
    gradient), the client's ``params`` by slot name (``encoder.0.weight``; trained ones carry
    the gradient) and each reference model's ``Forward`` on ``x`` (no gradient)."""

    x: torch.Tensor
    targets: torch.Tensor | dict[str, torch.Tensor]
    features: torch.Tensor
    outputs: torch.Tensor
    params: dict[str, torch.Tensor]
    references: dict[str, Forward]


LossTerm = Callable[[Batch], torch.Tensor]
"""A differentiable scalar added to one client's data loss at every step of its fit."""


def forward_with(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor) -> Forward:
    """``model``'s (a ``SplitModel``'s) encoder and head run with ``params`` by slot name in
    place of its own tensors (``torch.func.functional_call``: the model is left as it was)."""

    def part(name: str) -> dict[str, torch.Tensor]:
        prefix = name + "."
        return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}

    features = functional_call(model.encoder, part("encoder"), (x,))
    return Forward(features, functional_call(model.head, part("head"), (features,)))


@torch.no_grad()
def reference_forward(model: nn.Module, params: dict[str, torch.Tensor],
                      x: torch.Tensor) -> Forward:
    """A frozen reference model's ``Forward`` on ``x``: no gradient, eval mode (no running
    statistics updated, no dropout drawn), the model's mode restored after."""
    training = model.training
    model.eval()
    try:
        return forward_with(model, params, x)
    finally:
        model.train(training)
