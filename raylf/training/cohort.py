"""Lockstep cohort training: many clients' local SGD advanced by one batched step at a time.

A worker's participants each run the same local update on their own data (a ``FitPlan``). Run
one after another, a small model spends most of each step in per-call overhead, and a GPU sits
idle between tiny kernels. Here the clients' parameters are stacked along a leading client
dimension and one ``torch.func.vmap``-ed gradient call advances every client of the cohort.

Each client keeps its own minibatch order from its own seed (the same ``randperm`` stream as the
sequential trainer), and its own momentum. Clients of different sizes follow their own step
counts: at every step only clients with a batch left take part, grouped by batch size (a full
batch, or the short last batch of an epoch), so each client's loss is the ordinary mean over
its own batch and a finished client is neither updated nor has its momentum advanced. The
schedule and the step are the sequential trainer's own (``raylf.training.sgd``: prox → clip → weight
decay → momentum), the step taken on the stacked clients at once: per-client results equal the
sequential path's up to float rounding of the batched kernels (the contract suite checks every
plan-declaring method at 1e-5, ``raylf.testing``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from raylf import learning_check
from raylf.data.federation import Split
from raylf.schema import OptimizerSpec
from raylf.training import sgd
from raylf.training.layout import PARTS
from raylf.training.objective import Batch, Forward, LossTerm, forward_with
from raylf.training.sequential import AfterStep, FitResult, LocalTrainer

# Memory a cohort may use, as a share of what the device has free when it is sized.
MEMORY_SHARE = 0.25


def unsupported_reason(model: nn.Module) -> str | None:
    """Why this model cannot train in cohorts (None if it can): modules whose forward updates
    state (BatchNorm running statistics) or draws randomness (dropout) per client."""
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            return f"{name} ({type(module).__name__}) updates running statistics in forward"
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            return f"{name} ({type(module).__name__}) draws per-client randomness"
    return None


class BatchedLayers:
    """The model's forward over stacked parameters, layer by layer: a Linear becomes one
    ``baddbmm`` over all clients, a Conv2d one grouped convolution with the clients side by side
    in the channel dimension; activations, pooling and flattening act on the merged batch. One
    ordinary autograd pass then yields every client's gradient. For small models this is several
    times cheaper per step than ``vmap`` over ``functional_call``, whose per-call bookkeeping
    costs more than the arithmetic; models with other layers use ``vmap``."""

    ELEMENTWISE = (nn.ReLU, nn.Identity)

    def __init__(self, model: nn.Module):
        self.model = model
        # the leaves in forward order, listed once per part: walking the module tree every step
        # costs more than a small model's arithmetic
        leaves = [(f"{name}.", module) for name, module in model.named_modules()
                  if module is not model and not any(True for _ in module.children())]
        self.parts = {part: [(p, m) for p, m in leaves if p.startswith(part + ".")]
                      for part in PARTS}

    @classmethod
    def supports(cls, model: nn.Module) -> bool:
        leaf = (nn.Linear, nn.Conv2d, nn.MaxPool2d, nn.Flatten, *cls.ELEMENTWISE)
        return all(isinstance(m, leaf) for m in model.modules()
                   if not isinstance(m, nn.Sequential) and m is not model
                   and not any(True for _ in m.children()))

    def __call__(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``x`` is (clients, batch, *sample); the output (clients, batch, outputs)."""
        return self.head(params, self.features(params, x))

    def features(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """The encoder's output (clients, batch, …)."""
        return self._run("encoder", params, x)

    def head(self, params: dict[str, torch.Tensor], features: torch.Tensor) -> torch.Tensor:
        """The head's output (clients, batch, outputs) on the features."""
        return self._run("head", params, features)

    def _run(self, part: str, params, x):
        for prefix, module in self.parts[part]:
            x = self._apply(module, prefix, params, x)
        return x

    @staticmethod
    def _apply(module: nn.Module, prefix: str, params, x):
        if isinstance(module, nn.Linear):
            weight = params[prefix + "weight"].transpose(1, 2)
            bias = params.get(prefix + "bias")
            return torch.bmm(x, weight) if bias is None else torch.baddbmm(bias[:, None], x, weight)
        if isinstance(module, nn.Conv2d):
            weight, bias = params[prefix + "weight"], params.get(prefix + "bias")
            conv = (module.stride, module.padding, module.dilation)
            clients, batch = x.shape[:2]
            if x.device.type == "cpu":  # oneDNN's grouped convolution is 2–3× slower than
                return torch.stack([F.conv2d(x[c], weight[c], None if bias is None else bias[c],
                                             *conv) for c in range(clients)])  # one per client
            merged = x.transpose(0, 1).reshape(batch, -1, *x.shape[3:])
            out = F.conv2d(merged, weight.flatten(0, 1), None if bias is None else bias.flatten(),
                           *conv, clients)
            return out.view(batch, clients, -1, *out.shape[2:]).transpose(0, 1)
        if isinstance(module, nn.MaxPool2d):
            out = F.max_pool2d(x.flatten(0, 1), module.kernel_size, module.stride,
                               module.padding, module.dilation, module.ceil_mode)
            return out.view(*x.shape[:2], *out.shape[1:])
        if isinstance(module, nn.Flatten):
            return x.flatten(module.start_dim + 1, module.end_dim)
        return module(x)


# On a CPU, stacking clients layer by layer loses to one client at a time once convolutions
# dominate: the stacked activations leave the caches. Measured per lockstep step of 10 clients
# (batch 32, 1 thread): the cnn on 8×8 inputs (8.3e4 convolution MACs per sample) 0.67× the
# sequential time, on 16×16 (3.3e5) 1.15×, on 28×28 (1.0e6) 1.56×; an mlp 784-256-10 0.75×.
CPU_CONV_MACS_PER_SAMPLE = 1.5e5


def conv_macs_per_sample(model: nn.Module, sample_shape: tuple[int, ...]) -> float:
    """Multiply-accumulates of the model's convolutions for one input sample."""
    total = 0.0

    def count(module, _inputs, output):
        nonlocal total
        kernel = module.weight.shape[1] * module.weight[0, 0].numel()
        total += output[0].numel() * kernel

    convolutions = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    if not convolutions:  # nothing to count, and the zeros below would not suit every model
        return 0.0  # (a character LSTM embeds token ids: a float input fails it)
    hooks = [m.register_forward_hook(count) for m in convolutions]
    try:
        with torch.no_grad():
            model(torch.zeros(1, *sample_shape, device=next(model.parameters()).device))
    finally:
        for hook in hooks:
            hook.remove()
    return total


def not_worthwhile(model: nn.Module, sample_shape: tuple[int, ...],
                   device: torch.device) -> str | None:
    """Why ``cohort: auto`` trains this model one client at a time here (None: cohorts pay)."""
    if device.type == "cpu":
        macs = conv_macs_per_sample(model, sample_shape)
        if macs > CPU_CONV_MACS_PER_SAMPLE:
            return (f"convolutions of {macs:.1e} MACs per sample run faster one client at a "
                    f"time on a CPU (above {CPU_CONV_MACS_PER_SAMPLE:.1e}; set "
                    "resources.cohort to a number to force cohorts)")
    return None


@dataclass(frozen=True)
class CohortMember:
    """One client of a cohort: where its rows are in the shard's training split, its start
    vector, its seed, and what of its plan may differ between clients: its proximal anchor and
    strength, its loss terms, its reference models (by the names every member gives) and its
    after-step map (``LocalTrainer.fit``'s)."""

    position: int
    start: torch.Tensor
    seed: int
    anchor: torch.Tensor | None = None
    mu: float = 0.0
    terms: tuple[LossTerm, ...] = ()
    references: dict[str, torch.Tensor] = field(default_factory=dict)
    after_step: AfterStep | None = None


class CohortTrainer:
    """Batched local SGD over a LocalTrainer's model, layout and optimizer settings."""

    def __init__(self, trainer: LocalTrainer):
        self.trainer = trainer
        self.layout = trainer.layout
        self.params = [s for s in self.layout.slots if s.is_param]
        self.part_of = {s.name: s.name.split(".", 1)[0] for s in self.params}
        model = trainer.model
        self.layers = BatchedLayers(model) if BatchedLayers.supports(model) else None
        self._footprints: dict[tuple, int] = {}  # (batch, sample shape, dtype) → bytes a client

    def per_client_bytes(self, batch_size: int, inputs: torch.Tensor) -> int:
        """A cohort member's footprint: parameters, gradients, momentum and anchor (4 × P
        floats) plus a batch's activations, measured once by running the model on one batch of
        zeros shaped and typed as ``inputs``' samples (token ids for a character model)."""
        activations = 0

        def count(_module, _inputs, output):
            nonlocal activations
            if torch.is_tensor(output):
                activations += output.numel()

        model = self.trainer.model
        hooks = [m.register_forward_hook(count) for m in model.modules()]
        try:
            with torch.no_grad():
                model(inputs.new_zeros(batch_size, *inputs.shape[1:]))
        finally:
            for hook in hooks:
                hook.remove()
        return 4 * (4 * self.layout.size + 2 * activations)  # float32, forward + backward

    def size(self, setting: str | int, participants: int, batch_size: int,
             inputs: torch.Tensor) -> int:
        """Clients per lockstep batch: a number, or ``auto`` from the device's free memory for
        batches of ``inputs``' samples."""
        if setting != "auto":
            return max(1, int(setting))
        device = self.trainer.device
        if device.type == "cuda":
            free = torch.cuda.mem_get_info(device)[0]
        else:
            import psutil

            free = psutil.virtual_memory().available
        key = (batch_size, tuple(inputs.shape[1:]), inputs.dtype)
        if key not in self._footprints:
            self._footprints[key] = self.per_client_bytes(batch_size, inputs)
        fits = int(MEMORY_SHARE * free // self._footprints[key])
        return max(1, min(participants, fits))

    def fit(self, members: list[CohortMember], split: Split, targets: str, *,
            trainable: tuple[str, ...] = PARTS, loss_fn=None, epochs: int | None = None,
            max_steps: int | None = None,
            optimizer: OptimizerSpec | None = None) -> tuple[torch.Tensor, list[FitResult]]:
        """Train every member as ``LocalTrainer.fit`` would (``epochs``, default the
        federation's local epochs, cut after ``max_steps``; ``optimizer`` replacing the
        trainer's); the trained flat vectors (members × P) and one FitResult per member.

        At every step the clients with a batch left are grouped by batch size and proximal
        strength; each group takes one batched gradient and one ``raylf.training.sgd.step_`` on
        its rows of the stacked weights and optimizer state (gathered and written back when not
        everyone steps). A member's loss terms and after-step map are its own functions of its
        own rows."""
        trainer = self.trainer
        device, batch = trainer.device, trainer.batch_size
        cfg = optimizer or trainer.optimizer
        if epochs is None and max_steps is None:
            epochs = trainer.local_epochs
        flat = torch.stack([m.start for m in members]).to(device)
        trained = [s for s in self.params if self.part_of[s.name] in trainable]
        frozen = [s for s in self.params if self.part_of[s.name] not in trainable]
        weights, fixed = self._stacked(flat, trained), self._stacked(flat, frozen)
        names = list(weights)
        prox = members[0].anchor is not None
        anchors = self._stacked(torch.stack([m.anchor for m in members]).to(device), trained) \
            if prox else {}
        references = {name: self._stacked(torch.stack([m.references[name] for m in members])
                                          .to(device), self.params)
                      for name in members[0].references}
        state = sgd.zero_state([weights[k] for k in names], cfg)
        state = {} if state is None else dict(zip(names, state))
        step_fn = self._gradients(loss_fn)
        schedules = [self._schedule(split, m, batch, epochs, max_steps, device)
                     for m in members]
        totals = torch.zeros(len(members), device=device)
        steps, samples = [0] * len(members), [0] * len(members)
        trainer.model.train()
        for t in range(max(map(len, schedules), default=0)):
            groups: dict[tuple[int, float], list[int]] = defaultdict(list)
            for c, schedule in enumerate(schedules):
                if t < len(schedule):  # a finished client takes no step, its state rests
                    groups[len(schedule[t]), members[c].mu].append(c)
            for (size, mu), clients in groups.items():
                index = torch.as_tensor(clients, device=device)
                whole = len(clients) == len(members)

                def take(tree, whole=whole, index=index):
                    return tree if whole else {k: v.index_select(0, index)
                                               for k, v in tree.items()}

                rows = torch.stack([schedules[c][t] for c in clients])
                y = split.y[rows] if targets == "labels" else {
                    k: v[rows] for k, v in split.tasks.items()}
                current, resting, pinned = take(weights), take(state), take(fixed)
                if any(members[c].terms for c in clients):
                    grads, losses = self._with_terms(
                        loss_fn, current, pinned, split.x[rows], y,
                        [members[c].terms for c in clients],
                        {name: take(tree) for name, tree in references.items()})
                else:
                    grads, losses = step_fn(current, pinned, split.x[rows], y)
                pulls = take(anchors)
                sgd.step_([current[k] for k in names], [grads[k] for k in names],
                          [resting[k] for k in names] if state else None, cfg, step=t + 1,
                          anchors=[pulls[k] for k in names] if prox else None, mu=mu)
                if not whole:  # the group's rows were gathered: write them back
                    for k in names:
                        weights[k].index_copy_(0, index, current[k])
                        if state:
                            state[k].index_copy_(0, index, resting[k])
                for c in clients:
                    if members[c].after_step is not None:
                        self._after_step(members[c].after_step, weights, fixed, c, cfg.lr)
                totals.index_add_(0, index, losses.detach())
                for c in clients:
                    steps[c] += 1
                    samples[c] += size
        for s in trained:
            flat[:, s.offset: s.offset + s.numel] = weights[s.name].reshape(len(members), -1)
        results = [FitResult(float(totals[c]) / max(steps[c], 1), steps[c], samples[c])
                   for c in range(len(members))]
        return flat, results

    @staticmethod
    def _stacked(source: torch.Tensor, slots) -> dict[str, torch.Tensor]:
        """The ``slots`` of stacked flat vectors (clients × P) as stacked tensors by name."""
        return {s.name: source[:, s.offset: s.offset + s.numel].reshape(-1, *s.shape)
                for s in slots}

    def _forward(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> Forward:
        """Every client's features and outputs (clients × batch × …) with its own rows of
        ``params``: layer by layer when the model allows, else one client at a time."""
        if self.layers is not None:
            features = self.layers.features(params, x)
            return Forward(features, self.layers.head(params, features))
        forwards = [forward_with(self.trainer.model, {k: v[c] for k, v in params.items()}, x[c])
                    for c in range(len(x))]
        return Forward(torch.stack([f.features for f in forwards]),
                       torch.stack([f.outputs for f in forwards]))

    def _with_terms(self, loss_fn, current, pinned, x, y, terms, references):
        """(gradients, per-client data losses) of each client's data loss plus its own loss
        terms, from one forward pass of the group; the terms see each client's rows only, as
        the sequential fit hands them its ``Batch``."""
        leaves = {k: v.detach().requires_grad_(True) for k, v in current.items()}
        params = {**leaves, **pinned}
        ours = self._forward(params, x)
        with torch.no_grad():
            theirs = {name: self._forward(tree, x) for name, tree in references.items()}
        losses = torch.stack([loss_fn(ours.outputs[c], _row(y, c)) for c in range(len(x))])
        extra = [sum(term(Batch(x[c], _row(y, c), ours.features[c], ours.outputs[c],
                                {k: v[c] for k, v in params.items()},
                                {name: Forward(f.features[c], f.outputs[c])
                                 for name, f in theirs.items()}))
                     for term in client_terms)
                 for c, client_terms in enumerate(terms) if client_terms]
        grads = torch.autograd.grad(losses.sum() + sum(extra), list(leaves.values()),
                                    allow_unused=True)
        return ({k: torch.zeros_like(v) if g is None else g
                 for (k, v), g in zip(leaves.items(), grads)}, losses.detach())

    @staticmethod
    @torch.no_grad()
    def _after_step(after_step: AfterStep, weights, fixed, c: int, lr: float) -> None:
        """Client ``c``'s after-step map on its own rows of the stacked parameters."""
        rows = {**{k: v[c] for k, v in weights.items()}, **{k: v[c] for k, v in fixed.items()}}
        for name, value in after_step(rows, lr).items():
            rows[name].copy_(value)

    @torch.no_grad()
    def predict(self, vectors: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Outputs of each client's model (rows of ``vectors``) on its own inputs
        (clients × n × sample): evaluation of personal models in one batched pass."""
        params = self._stacked(vectors, self.params)
        model = self.trainer.model
        model.eval()
        if self.layers is not None:
            return self.layers(params, x)
        return vmap(lambda p, inputs: functional_call(model, p, (inputs,)))(params, x)

    def dead_relu_fractions(self, vectors: torch.Tensor, split: Split,
                            positions: list[int]) -> list[float | None] | None:
        """Each client's ``learning_check.dead_relu_fraction`` on its first ``PROBE_SAMPLES``
        training rows, from one batched forward (None where vmap runs the model: its hooks see
        no per-client outputs). A client with fewer rows repeats them, which keeps "zero for
        every sample" exact; a client with none gets None."""
        if self.layers is None:
            return None
        probe = learning_check.PROBE_SAMPLES
        spans = [split.rows(p) for p in positions]
        rows = torch.stack([span.start + torch.arange(probe) % max(span.stop - span.start, 1)
                            for span in spans]).to(self.trainer.device)
        fractions = learning_check.dead_relu_fractions(
            self.trainer.model.encoder, lambda: self.predict(vectors, split.x[rows]),
            clients=len(positions))
        return [None if span.stop == span.start else f for span, f in zip(spans, fractions)]

    def _gradients(self, loss_fn):
        """(trained params, frozen params, x, y) of a group → (gradients, per-client losses)."""
        if self.layers is None:
            model = self.trainer.model

            def loss_of(train_params, frozen_params, x, y):
                return loss_fn(functional_call(model, {**train_params, **frozen_params}, (x,)), y)

            return vmap(grad_and_value(loss_of))

        def batched(train_params, frozen_params, x, y):
            leaves = {k: v.detach().requires_grad_(True) for k, v in train_params.items()}
            out = self.layers({**leaves, **frozen_params}, x)
            if loss_fn is F.cross_entropy and torch.is_tensor(y):  # one call for the cohort
                losses = F.cross_entropy(out.flatten(0, 1), y.flatten(),
                                         reduction="none").view(y.shape).mean(1)
            else:
                losses = torch.stack([loss_fn(out[c], _row(y, c)) for c in range(len(out))])
            grads = torch.autograd.grad(losses.sum(), list(leaves.values()))
            return dict(zip(leaves, grads)), losses.detach()

        return batched

    @staticmethod
    def _schedule(split: Split, member: CohortMember, batch: int, epochs: int | None,
                  max_steps: int | None, device: torch.device) -> list[torch.Tensor]:
        """The member's minibatches as rows of the shard's split: ``raylf.training.sgd``'s schedule
        from its seed, as the sequential trainer draws it."""
        rows = split.rows(member.position)
        n = rows.stop - rows.start
        orders = sgd.SeededOrders(n, member.seed, device)
        return [idx + rows.start for idx in sgd.minibatches(
            orders, n, batch, sgd.step_count(n, batch, epochs, max_steps))]


def cohorts(count: int, size: int) -> list[slice]:
    """``count`` clients cut into consecutive lockstep batches of at most ``size``."""
    batches = max(1, math.ceil(count / size))
    bounds = [round(i * count / batches) for i in range(batches + 1)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]


def _row(targets, c: int):
    """Client ``c``'s targets: a label tensor or a dict of task labels."""
    return targets[c] if torch.is_tensor(targets) else {k: v[c] for k, v in targets.items()}
