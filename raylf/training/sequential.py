"""The sequential trainer: a client's local SGD (``raylf.training.sgd``), gradients, loss and
evaluation, one client at a time.

A ``LocalTrainer`` owns one model whose parameters and floating buffers are views into a single
flat tensor (``raylf.training.layout``), so loading what a client received and reading what it
uploads are one copy each, and the same model instance serves every virtual client of a worker.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from raylf.schema import OptimizerSpec
from raylf.training import sgd
from raylf.training.layout import PARTS, ParamLayout
from raylf.training.objective import Batch, LossTerm, reference_forward
from raylf.training.rewrites import rewrite_for_training


def _resolve(model: nn.Module, dotted: str) -> tuple[nn.Module, str]:
    *path, leaf = dotted.split(".")
    module = model
    for p in path:
        module = getattr(module, p)
    return module, leaf


@dataclass(frozen=True)
class FitResult:
    loss: float  # mean minibatch loss over the local update (nan/inf = diverged)
    steps: int
    samples: int


LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
AfterStep = Callable[[dict[str, torch.Tensor], float], dict[str, torch.Tensor]]
"""A map applied after every optimizer step of size lr (a proximal map of lr × a term kept out
of the loss): one client's parameters by name and lr → new values of some of them."""


class LocalTrainer:
    """One reusable model plus the optimizer settings shared by every client of an experiment."""

    def __init__(self, model: nn.Module, layout: ParamLayout, optimizer: OptimizerSpec,
                 batch_size: int, local_epochs: int, device: torch.device):
        self.model = model.to(device)
        rewrite_for_training(self.model, device)
        self.layout = layout
        self.device = device
        self.batch_size = batch_size
        self.local_epochs = local_epochs
        self.optimizer = optimizer
        self.flat = torch.empty(layout.size, device=device)
        self._offsets: dict[int, int] = {}  # parameter id -> offset in the flat vector
        for slot in layout.slots:
            owner, leaf = _resolve(self.model, slot.name)
            view = self.flat[slot.offset: slot.offset + slot.numel].view(slot.shape)
            current = getattr(owner, leaf)
            view.copy_(current.detach())
            if slot.is_param:
                current.data = view
                self._offsets[id(current)] = slot.offset
            else:
                setattr(owner, leaf, view)
        self._params = {part: [p for n, p in self.model.named_parameters()
                               if n.startswith(part + ".")] for part in PARTS}
        self._named = dict(self.model.named_parameters())  # Slot.name → parameter
        self.fits: list[FitResult] = []  # every fit and gradient since the runtime last cleared it

    # -- flat vector access ------------------------------------------------------------------
    def load(self, vector: torch.Tensor, part: str | None = None) -> None:
        target = self.flat if part is None else self.flat[self.layout.part(part)]
        target.copy_(vector, non_blocking=True)

    def vector(self, part: str | None = None) -> torch.Tensor:
        source = self.flat if part is None else self.flat[self.layout.part(part)]
        return source.detach().clone()

    # -- training ----------------------------------------------------------------------------
    def fit(self, x: torch.Tensor, y: torch.Tensor, *, seed: int,
            trainable: tuple[str, ...] = PARTS, epochs: int | None = None,
            max_steps: int | None = None,
            prox: tuple[torch.Tensor, float] | None = None,
            loss_fn: LossFn = F.cross_entropy,
            terms: tuple[LossTerm, ...] = (),
            references: dict[str, torch.Tensor] | None = None,
            after_step: AfterStep | None = None,
            optimizer: OptimizerSpec | None = None) -> FitResult:
        """Minibatch stochastic gradient descent on (x, y) for ``epochs`` (default: the
        federation's local epochs), one client: the schedule and step of
        ``raylf.training.sgd`` with a client dimension of one.

        ``max_steps`` stops after that many optimizer steps (epochs continue as needed when
        ``epochs`` is not given: Ditto's and FedAvg's "τ local steps" variants).
        ``prox=(anchor, mu)`` adds mu·(w − anchor) to every trained parameter's gradient (the
        FedProx / Ditto proximal term, anchor given as a full flat vector). ``terms`` are added
        to the data loss at every step, each a function of the step's ``Batch``
        (``raylf.training.objective``), which holds each of ``references`` (frozen flat
        vectors by name) run on the batch; ``after_step`` maps the parameters by name and the
        learning rate (without autograd) after every optimizer step to new values of some, e.g.
        a proximal map for a term kept out of the loss. ``optimizer`` replaces the trainer's
        settings for this fit (FedBABU's fine-tuning). The loss logged is the data's.
        Parameters without a gradient in a step are not stepped and keep their optimizer
        state. Every fit is logged in ``fits`` (the runtime checks each one for divergence).
        """
        cfg = optimizer or self.optimizer
        n = len(y) if torch.is_tensor(y) else len(next(iter(y.values())))
        if epochs is None and max_steps is None:
            epochs = self.local_epochs
        params = [p for part in trainable for p in self._params[part]]
        for part in PARTS:
            for p in self._params[part]:
                p.requires_grad_(part in trainable)
        weights = [p.detach()[None] for p in params]  # the client dimension of one
        state = sgd.zero_state(weights, cfg)
        frozen = {name: self.parameters_of(vector) for name, vector in (references or {}).items()}
        anchors = None
        if prox is not None:
            anchors = [prox[0][self._offsets[id(p)]: self._offsets[id(p)] + p.numel()]
                       .view(1, *p.shape) for p in params]
        seed_global(seed, self.device)
        self.model.train()
        total = torch.zeros((), device=self.device)
        steps = samples = 0
        orders = sgd.SeededOrders(n, seed, self.device)
        for idx in sgd.minibatches(orders, n, self.batch_size, sgd.step_count(
                n, self.batch_size, epochs, max_steps)):
            target = y[idx] if torch.is_tensor(y) else {k: v[idx] for k, v in y.items()}
            features = self.model.encoder(x[idx])
            outputs = self.model.head(features)
            loss = loss_fn(outputs, target)
            objective = loss
            if terms:
                batch = Batch(x[idx], target, features, outputs, self._named, {
                    name: reference_forward(self.model, tensors, x[idx])
                    for name, tensors in frozen.items()})
                objective = loss + sum(term(batch) for term in terms)
            for p in params:
                p.grad = None
            objective.backward()
            stepped = [i for i, p in enumerate(params) if p.grad is not None]
            sgd.step_(
                [weights[i] for i in stepped], [params[i].grad[None] for i in stepped],
                None if state is None else [state[i] for i in stepped], cfg, step=steps + 1,
                anchors=None if anchors is None else [anchors[i] for i in stepped],
                mu=0.0 if prox is None else prox[1])
            if after_step is not None:
                with torch.no_grad():
                    for name, value in after_step(self._named, cfg.lr).items():
                        self._named[name].copy_(value)
            total += loss.detach()
            steps += 1
            samples += len(idx)
        result = FitResult(float(total) / max(steps, 1), steps, samples)
        self.fits.append(result)
        return result

    def gradient(self, x: torch.Tensor, y, *, loss_fn: LossFn = F.cross_entropy,
                 part: str | None = None, advance_statistics: bool = False) -> torch.Tensor:
        """The gradient of ``loss_fn`` on this one minibatch at the loaded weights, as a flat
        vector over ``part`` (or the whole layout; buffers get zeros), for methods whose client
        step is a gradient (SP-CACW, FC). The model runs in train mode, as in ``fit``, but its
        buffers (BatchNorm statistics) are restored: computing a gradient changes no state;
        with ``advance_statistics`` they keep what the forward pass made of them, as a step of
        ``fit`` would (a local loop written by hand: APFL's, Per-FedAvg's), and the loaded
        vector holds them. The minibatch loss is logged in ``fits`` with zero steps, so
        divergence is checked."""
        saved = None if advance_statistics else self.flat.clone()
        self.model.train()
        params = [p for name in PARTS for p in self._params[name]]
        for p in params:
            p.requires_grad_(True)
        self.model.zero_grad(set_to_none=True)
        loss = loss_fn(self.model(x), y)
        loss.backward()
        grad = torch.zeros_like(self.flat)
        for p in params:
            if p.grad is not None:
                offset = self._offsets[id(p)]
                grad[offset: offset + p.numel()] = p.grad.reshape(-1)
        self.model.zero_grad(set_to_none=True)
        if saved is not None:
            self.flat.copy_(saved)
        self.fits.append(FitResult(float(loss.detach()), 0, len(x)))
        return grad if part is None else grad[self.layout.part(part)].clone()

    def gradients_at(self, weights: torch.Tensor, x: torch.Tensor, y, *,
                     loss_fn: LossFn = F.cross_entropy, seed: int | None = None) -> torch.Tensor:
        """``gradient`` on this one minibatch at each row of ``weights`` (T, P), as (T, P), in
        one vectorized call (``torch.func``: ``functional_call`` under ``vmap`` of ``grad``)
        instead of T loads and backward passes: SP-CACW's and FC's peers compute their gradient
        at every target's model. Each row's buffers (BatchNorm statistics) are its own copy, so
        nothing changes the loaded model; dropout draws differently per row from the global
        generator, seeded with ``seed`` when given. The mean minibatch loss over the rows is
        logged in ``fits`` like ``gradient``'s."""
        from torch.func import functional_call, grad_and_value, vmap

        rows = len(weights)
        params, buffers = {}, {}
        for slot in self.layout.slots:
            block = weights[:, slot.offset: slot.offset + slot.numel].reshape(rows, *slot.shape)
            if slot.is_param:
                params[slot.name] = block
            else:
                buffers[slot.name] = block.clone()
        for name, buffer in self.model.named_buffers():  # integer ones, e.g. batch counters
            if name not in buffers:
                buffers[name] = buffer.expand(rows, *buffer.shape).clone()

        def loss(p, b):
            return loss_fn(functional_call(self.model, (p, b), (x,)), y)

        if seed is not None:
            seed_global(seed, self.device)
        self.model.train()
        grads, losses = vmap(grad_and_value(loss), randomness="different")(params, buffers)
        out = torch.zeros_like(weights)
        for slot in self.layout.slots:
            if slot.is_param:
                out[:, slot.offset: slot.offset + slot.numel] = grads[slot.name].reshape(rows, -1)
        self.fits.append(FitResult(float(losses.mean()), 0, len(x)))
        return out

    def parameters_of(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        """A flat vector as the model's tensors by slot name (views, no copy)."""
        return {s.name: vector[s.offset: s.offset + s.numel].view(s.shape)
                for s in self.layout.slots}

    # -- evaluation --------------------------------------------------------------------------
    @torch.no_grad()
    def loss(self, x: torch.Tensor, y, *, loss_fn: LossFn = F.cross_entropy,
             chunk: int = 4096) -> float:
        """Mean per-sample loss of the loaded model on (x, y), in eval mode (IFCA's lowest-loss
        choice, FedCE's and Ditto's scores). ``loss_fn`` must average over its batch."""
        n = len(y) if torch.is_tensor(y) else len(next(iter(y.values())))
        if n == 0:
            return math.nan
        self.model.eval()
        total = 0.0
        for i in range(0, n, chunk):
            target = y[i: i + chunk] if torch.is_tensor(y) else {
                k: v[i: i + chunk] for k, v in y.items()}
            rows = len(x[i: i + chunk])
            total += float(loss_fn(self.model(x[i: i + chunk]), target)) * rows
        return total / n

    def accuracy(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Top-1 accuracy of the loaded model on (x, y); nan on an empty split."""
        if len(y) == 0:
            return math.nan
        return float((self.predict(x).argmax(1) == y).float().mean())

    @torch.no_grad()
    def predict(self, x: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
        self.model.eval()
        if len(x) == 0:
            return torch.zeros(0, device=self.device)
        return torch.cat([self.model(x[i: i + chunk]) for i in range(0, len(x), chunk)])


def seed_global(seed: int, device: torch.device) -> None:
    """Seed the global generators a model's own randomness (dropout) draws from: the CPU's and
    ``device``'s. Same streams as ``torch.manual_seed``, which also queues a lazy seeding call
    with a formatted stack trace for every uninitialized accelerator backend: 82 µs against
    1 µs per call, paid once per client per round."""
    torch.random.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)
