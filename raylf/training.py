"""The shared client arithmetic: flat parameter vectors, local SGD (``raylf.sgd``), evaluation.

A ``LocalTrainer`` owns one model whose parameters and floating buffers are views into a single
flat tensor, so loading what a client received and reading what it uploads are one copy each, and
the same model instance serves every virtual client of a worker.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from raylf import sgd

PARTS = ("encoder", "head")


@dataclass(frozen=True)
class Slot:
    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int
    is_param: bool


@dataclass(frozen=True)
class ParamLayout:
    """Where each tensor of a ``SplitModel`` lives in its flat vector: encoder first, then head.

    Encoder and head are contiguous ranges, so a method shares or keeps a part by slicing.
    """

    slots: tuple[Slot, ...]
    parts: dict[str, slice]

    @classmethod
    def of(cls, model: nn.Module) -> ParamLayout:
        slots, parts, offset = [], {}, 0
        for part in PARTS:
            start = offset
            module = getattr(model, part)
            named = [(f"{part}.{n}", t, True) for n, t in module.named_parameters()]
            named += [(f"{part}.{n}", t, False) for n, t in module.named_buffers()
                      if t.is_floating_point()]
            for name, tensor, is_param in named:
                slots.append(Slot(name, tuple(tensor.shape), offset, tensor.numel(), is_param))
                offset += tensor.numel()
            parts[part] = slice(start, offset)
        return cls(tuple(slots), parts)

    @property
    def size(self) -> int:
        return self.parts[PARTS[-1]].stop

    def part(self, name: str) -> slice:
        return self.parts[name]

    def part_size(self, name: str) -> int:
        s = self.parts[name]
        return s.stop - s.start


def _resolve(model: nn.Module, dotted: str) -> tuple[nn.Module, str]:
    *path, leaf = dotted.split(".")
    module = model
    for p in path:
        module = getattr(module, p)
    return module, leaf


def model_vector(model: nn.Module, layout: ParamLayout) -> torch.Tensor:
    """The flat vector of a freshly built model (its initialization)."""
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    return torch.cat([state[s.name].detach().reshape(-1).float() for s in layout.slots])


@dataclass(frozen=True)
class FitResult:
    loss: float  # mean minibatch loss over the local update (nan/inf = diverged)
    steps: int
    samples: int


LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Penalty = Callable[[dict[str, torch.Tensor]], torch.Tensor]
"""An extra term of the local objective, of one client's parameters by name (``Slot.name``)."""
AfterStep = Callable[[dict[str, torch.Tensor], float], dict[str, torch.Tensor]]
"""A map applied after every optimizer step of size lr (a proximal map of lr × a term kept out
of the loss): one client's parameters by name and lr → new values of some of them."""


class LocalTrainer:
    """One reusable model plus the optimizer settings shared by every client of an experiment."""

    def __init__(self, model: nn.Module, layout: ParamLayout, optimizer, batch_size: int,
                 local_epochs: int, device: torch.device):
        self.model = model.to(device)
        rewrite_for_training(self.model, device)
        self.layout = layout
        self.device = device
        self.batch_size = batch_size
        self.local_epochs = local_epochs
        self.opt_cfg = optimizer
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
            penalty: Penalty | None = None,
            after_step: AfterStep | None = None) -> FitResult:
        """Minibatch SGD on (x, y) for ``epochs`` (default: the federation's local epochs), one
        client: the schedule and step of ``raylf.sgd`` with a client dimension of one.

        ``max_steps`` stops after that many optimizer steps (epochs continue as needed when
        ``epochs`` is not given: Ditto's and FedAvg's "τ local steps" variants).
        ``prox=(anchor, mu)`` adds mu·(w − anchor) to every trained parameter's gradient (the
        FedProx / Ditto proximal term, anchor given as a full flat vector). ``penalty`` maps the
        parameters by name (``Slot.name``) to an extra differentiable term added to the loss
        each step; ``after_step`` maps them and the learning rate (without autograd) after
        every optimizer step to new values of some, e.g. a proximal map for a term kept out of
        the loss. Parameters without a gradient in a step are not stepped and keep their
        momentum. Every fit is logged in ``fits`` (the runtime checks each one for divergence).
        """
        n = len(y) if torch.is_tensor(y) else len(next(iter(y.values())))
        if epochs is None and max_steps is None:
            epochs = self.local_epochs
        params = [p for part in trainable for p in self._params[part]]
        for part in PARTS:
            for p in self._params[part]:
                p.requires_grad_(part in trainable)
        weights = [p.detach()[None] for p in params]  # the client dimension of one
        momenta = sgd.zero_momenta(weights, self.opt_cfg)
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
            loss = loss_fn(self.model(x[idx]), target)
            objective = loss if penalty is None else loss + penalty(self._named)
            for p in params:
                p.grad = None
            objective.backward()
            stepped = [i for i, p in enumerate(params) if p.grad is not None]
            sgd.step_(
                [weights[i] for i in stepped], [params[i].grad[None] for i in stepped],
                None if momenta is None else [momenta[i] for i in stepped], self.opt_cfg,
                anchors=None if anchors is None else [anchors[i] for i in stepped],
                mu=0.0 if prox is None else prox[1])
            if after_step is not None:
                with torch.no_grad():
                    for name, value in after_step(self._named, self.opt_cfg.lr).items():
                        self._named[name].copy_(value)
            total += loss.detach()
            steps += 1
            samples += len(idx)
        result = FitResult(float(total) / max(steps, 1), steps, samples)
        self.fits.append(result)
        return result

    def gradient(self, x: torch.Tensor, y, *, loss_fn: LossFn = F.cross_entropy,
                 part: str | None = None) -> torch.Tensor:
        """The gradient of ``loss_fn`` on this one minibatch at the loaded weights, as a flat
        vector over ``part`` (or the whole layout; buffers get zeros), for methods whose client
        step is a gradient (SP-CACW, FC). The model runs in train mode, as in ``fit``, but its
        buffers (BatchNorm statistics) are restored: computing a gradient changes no state.
        The minibatch loss is logged in ``fits`` with zero steps, so divergence is checked."""
        saved = self.flat.clone()
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


def rewrite_for_training(model: nn.Module, device: torch.device) -> None:
    """The same arithmetic, faster: max-pools before the ReLUs they follow everywhere, and on a
    CPU channels-last convolutions for the models that ask for it."""
    pool_before_rectifying(model)
    if device.type == "cpu" and getattr(model, "channels_last_on_cpu", False):
        run_channels_last(model)


def pool_before_rectifying(model: nn.Module) -> None:
    """Swap each ReLU that a max-pool follows in an ``nn.Sequential`` (conv → ReLU → pool
    becomes conv → pool → ReLU). The ReLU is monotone, so the pool's maximum is taken at the
    same element and the outputs and gradients are bitwise the same, but the ReLU and its
    backward run on the pooled map, a quarter of the size. Measured on the heavy CNN (3×32×32,
    batch 32, one thread, freed memory kept): 5.95 → 5.25 ms per step. The dead-ReLU probe
    then sees pooled channels, which are alive exactly where the unpooled ones were except
    for values the pooling drops (an odd map's last row), which reach nothing anyway."""
    for sequence in model.modules():
        if not isinstance(sequence, nn.Sequential):
            continue
        layers = sequence._modules
        names = list(layers)
        for first, second in zip(names, names[1:]):
            if (type(layers[first]) is nn.ReLU and isinstance(layers[second], nn.MaxPool2d)
                    and not layers[second].return_indices):
                layers[first], layers[second] = layers[second], layers[first]


def run_channels_last(model: nn.Module) -> None:
    """Make every ``Conv2d`` of ``model`` take and give channels-last activations, so that the
    ReLUs and max-pools between them run on that layout too. The weights stay views into the
    trainer's flat vector (oneDNN reorders them itself). Same values up to float rounding of
    the convolutions' reductions (~1e-7 after an epoch). On one CPU thread PyTorch's max-pool
    of NCHW maps is slow (35 % of the heavy CNN's step); the measurements that decide which
    models ask for this are at ``models.SplitModel``."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            module.register_forward_pre_hook(_channels_last_input)
            module.register_forward_hook(_channels_last_output)


def _channels_last_input(_module: nn.Module, args: tuple) -> tuple:
    return (args[0].contiguous(memory_format=torch.channels_last), *args[1:])


def _channels_last_output(_module: nn.Module, _args: tuple, output: torch.Tensor) -> torch.Tensor:
    # a one-channel input is NCHW and channels-last at once, and then the convolution's output
    # comes back NCHW: turn it here, before the activations that follow
    return output.contiguous(memory_format=torch.channels_last)


def seed_global(seed: int, device: torch.device) -> None:
    """Seed the global generators a model's own randomness (dropout) draws from: the CPU's and
    ``device``'s. Same streams as ``torch.manual_seed``, which also queues a lazy seeding call
    with a formatted stack trace for every uninitialized accelerator backend: 82 µs against
    1 µs per call, paid once per client per round."""
    torch.random.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)


def weighted_mean(stacked: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ_k w_k v_k / Σ_k w_k over the rows of ``stacked`` in one matrix-vector product."""
    w = weights.to(stacked.dtype)
    return (w / w.sum()) @ stacked


def tensor_bytes(message) -> int:
    """Bytes on the wire for a message: tensors and arrays by size, Python scalars as 8 bytes."""
    if message is None:
        return 0
    if torch.is_tensor(message):
        return message.numel() * message.element_size()
    if isinstance(message, np.ndarray):
        return message.nbytes
    if isinstance(message, dict):
        return sum(tensor_bytes(v) for v in message.values())
    if isinstance(message, (list, tuple)):
        return sum(tensor_bytes(v) for v in message)
    return 8
