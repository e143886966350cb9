"""Local stochastic gradient descent, defined once: the minibatch schedule and the optimizer step
of every training path.

Three paths train a client's model: the sequential trainer (``LocalTrainer.fit``, one client at a
time), the cohort trainer (``CohortTrainer.fit``, many clients in lockstep) and the per-step
runtime (``raylf.methods.perstep``, one step of every learner per round). They take the same
steps because they call these functions rather than keeping copies equal by hand:

- the schedule (``step_count``, ``minibatch``): epochs of ⌈n/B⌉ steps, each epoch a permutation
  of the client's n samples cut into consecutive batches of B, the last one short. Where each
  epoch's permutation comes from is the caller's: one generator per local update drawn epoch
  after epoch (``SeededOrders``, both trainers), or a generator per epoch (the per-step runtime,
  which finds step r's batch without drawing the r − 1 before it);
- the step (``step_``): the proximal pull mu·(w − anchor) added to the gradient, the gradient
  clipped to a global norm, then the declared optimizer's own arithmetic through torch's
  functional form: ``torch.optim.SGD``'s (weight decay, momentum, learning rate) or
  ``torch.optim.Adam``'s (weight decay, the two moments, bias correction, learning rate).

Every tensor of a step leads with a client dimension: the cohort stacks its clients there, the
other paths pass a dimension of one. The step is elementwise but for clipping, whose norm is
taken per client, so a client's step does not depend on who it is stacked with; on a CPU one
client's step is ``clip_grad_norm_`` then ``torch.optim.SGD.step`` bit for bit
(tests/test_contract_primitives.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import torch
from torch.optim.adam import adam
from torch.optim.sgd import sgd

from raylf.schema import OptimizerSpec

Orders = Callable[[int], torch.Tensor]  # epoch → permutation of the client's samples


# ---- the schedule ------------------------------------------------------------------------------
def epoch_length(n: int, batch_size: int) -> int:
    """Steps of one pass over n samples: ⌈n / B⌉ (at least one, so that every step number falls
    in an epoch)."""
    return max(1, math.ceil(n / batch_size))


def step_count(n: int, batch_size: int, epochs: int | None, max_steps: int | None = None) -> int:
    """Steps of one local update over n samples: ``epochs`` passes, cut after ``max_steps``; with
    ``epochs`` None, exactly ``max_steps`` in as many passes as they take (Ditto's and FedAvg's
    "τ local steps" variants). No step without samples."""
    if n == 0:
        return 0
    if epochs is None:
        assert max_steps is not None, "a local update needs epochs or max_steps"
        return max_steps
    steps = epochs * epoch_length(n, batch_size)
    return steps if max_steps is None else min(steps, max_steps)


def minibatch(orders: Orders, n: int, batch_size: int, step: int) -> torch.Tensor:
    """Sample indices of step ``step`` (from 0): batch ``step mod ⌈n/B⌉`` of epoch
    ``step div ⌈n/B⌉``, whose permutation ``orders(epoch)`` gives."""
    epoch, position = divmod(step, epoch_length(n, batch_size))
    return orders(epoch)[position * batch_size: (position + 1) * batch_size]


def minibatches(orders: Orders, n: int, batch_size: int, steps: int) -> Iterator[torch.Tensor]:
    """The first ``steps`` minibatches of the schedule, in order."""
    return (minibatch(orders, n, batch_size, step) for step in range(steps))


class SeededOrders:
    """The epoch permutations of one local update: epoch e's is the (e + 1)-th ``randperm(n)``
    of one generator seeded with the update's seed, moved to ``device``. Epochs must be asked
    for in increasing order; each is drawn once, when first asked for, and only the current one
    is kept."""

    def __init__(self, n: int, seed: int, device: torch.device):
        self.n, self.device = n, device
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch, self.order = -1, torch.empty(0, dtype=torch.long)

    def __call__(self, epoch: int) -> torch.Tensor:
        assert epoch >= self.epoch, "epochs are drawn in order"
        while self.epoch < epoch:
            self.order = torch.randperm(self.n, generator=self.generator).to(self.device)
            self.epoch += 1
        return self.order


# ---- the step ----------------------------------------------------------------------------------
def clip_(grads: Sequence[torch.Tensor], max_norm: float) -> None:
    """Scale each client's gradients (row c of every tensor) in place to a global L2 norm of at
    most ``max_norm``: ``nn.utils.clip_grad_norm_``'s arithmetic (the norm of the per-tensor
    norms; coefficient max_norm / (norm + 1e-6), clamped at 1), one norm per row."""
    norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads])
    scale = (max_norm / (torch.linalg.vector_norm(norms, dim=0) + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(list(grads), [scale.view(-1, *[1] * (g.dim() - 1)) for g in grads])


def step_(weights: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
          state: Sequence[torch.Tensor] | None, cfg: OptimizerSpec, *, step: int = 1,
          anchors: Sequence[torch.Tensor] | None = None, mu: float = 0.0) -> None:
    """One local optimizer step, in place on ``weights``, ``grads`` and the optimizer ``state``
    (matching tensors, each leading with the client dimension; ``zero_state`` makes it): prox →
    clip → the optimizer's own arithmetic. ``step`` is the step's number in the fit, from 1
    (Adam's bias correction; every client stepping together has taken as many).

    The project's own parts come first: mu·(w − anchor) added to the gradient (the FedProx /
    Ditto / FedSoft proximal term, kept out of the loss so the loss logged is the data's), then
    clipping to ``cfg.grad_clip``, so the clipped norm includes the pull. The rest is
    ``torch.optim.sgd.sgd`` or ``torch.optim.adam.adam``, the arithmetic of
    ``torch.optim.SGD.step`` and ``torch.optim.Adam.step``; building those optimizer objects
    would import ``torch._dynamo``, 3–4 s in every fresh worker process here. SGD's momentum
    buffers start at zero (``state`` None when ``cfg.momentum`` is 0): μ·0 + d is d, the
    buffer torch's first step clones; Adam's state holds both moments of a tensor stacked
    after the client dimension."""
    with torch.no_grad():
        if anchors is not None:
            torch._foreach_add_(list(grads), torch._foreach_sub(list(weights), list(anchors)),
                                alpha=mu)
        if cfg.grad_clip is not None:
            clip_(grads, cfg.grad_clip)
        if cfg.name == "adam":
            adam(list(weights), list(grads), [s[:, 0] for s in state], [s[:, 1] for s in state],
                 [], [torch.tensor(float(step - 1)) for _ in weights], amsgrad=False,
                 beta1=cfg.betas[0], beta2=cfg.betas[1], lr=cfg.lr,
                 weight_decay=cfg.weight_decay, eps=cfg.eps, maximize=False)
            return
        sgd(list(weights), list(grads),
            list(state) if cfg.momentum else [None] * len(weights),
            weight_decay=cfg.weight_decay, momentum=cfg.momentum, lr=cfg.lr, dampening=0.0,
            nesterov=False, maximize=False)


def zero_state(weights: Sequence[torch.Tensor], cfg: OptimizerSpec) -> list[torch.Tensor] | None:
    """Fresh optimizer state for ``weights``, one tensor each (None for SGD without momentum):
    SGD's momentum buffers, or Adam's two moments stacked after the client dimension. Every
    local fit of the trainers starts its state at zero."""
    if cfg.name == "adam":
        return [w.new_zeros(w.shape[0], 2, *w.shape[1:]) for w in weights]
    return [torch.zeros_like(w) for w in weights] if cfg.momentum else None
