"""Lockstep cohort training: many clients' local SGD advanced by one batched step at a time.

A worker's participants each run the same local update on their own data (a ``FitPlan``). Run
one after another, a small model spends most of each step in per-call overhead, and a GPU sits
idle between tiny kernels. Here the clients' parameters are stacked along a leading client
dimension and one ``torch.func.vmap``-ed gradient call advances every client of the cohort.

Each client keeps its own minibatch order from its own seed (the same ``randperm`` stream as the
sequential trainer), its own momentum, its own running statistics (BatchNorm's: batch statistics
over its own minibatch in train mode, its running ones in eval mode) and its own dropout stream
(``ClientDropout``). Clients of different sizes follow their own step counts: at every step
only clients with a batch left take part, grouped by batch size (a full batch, or the short
last batch of an epoch), so each client's loss is the ordinary mean over
its own batch and a finished client is neither updated nor has its momentum advanced. The
schedule and the step are the sequential trainer's own (``raylf.training.sgd``: prox → clip → weight
decay → momentum), the step taken on the stacked clients at once: per-client results equal the
sequential path's up to float rounding of the batched kernels (the contract suite checks every
plan-declaring method at 1e-5, ``raylf.testing``).
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

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
    """Why this model cannot train in cohorts (None if it can). BatchNorm and dropout train in
    cohorts, each client with its own running statistics and its own dropout stream; what stays
    out is what no client's own copy reproduces: a BatchNorm whose running statistics average
    over its batch count (momentum None), a counter the worker's model shares between the
    clients it trains (the layout holds floating tensors only), and alpha dropout, which is not
    a mask on its input."""
    for name, module in model.named_modules():
        if isinstance(module, _BatchNorm) and module.track_running_stats \
                and module.momentum is None:
            return (f"{name} ({type(module).__name__}) averages its running statistics over a "
                    "batch count that the worker's clients share (momentum None)")
        if isinstance(module, (nn.AlphaDropout, nn.FeatureAlphaDropout)) and module.p > 0:
            return f"{name} ({type(module).__name__}) is not a mask on its input"
    return None


@contextmanager
def evaluating(model: nn.Module):
    """``model`` in eval mode while the block runs (BatchNorm on running statistics, nothing
    updated, no dropout drawn), every module's own mode restored after: a cohort's fit keeps
    its dropout modules in eval mode while the rest trains."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training


class ClientDropout:
    """Dropout in a cohort, each client's masks drawn from its own stream exactly as its
    sequential fit draws them.

    The sequential fit seeds the device's global generator with the fit's seed
    (``seed_global``) and the model's dropout modules draw from it in the order they run, step
    after step. Here each member keeps a state of that generator of its own. Before a step of
    a group, every member's masks are drawn by the dropout modules themselves (train-mode
    copies) on ones shaped and laid out as that step's activations are in the sequential model
    (elementwise dropout fills its noise in memory order, so a channels-last activation gets
    other masks than an NCHW one of the same values), the generator set to the member's state
    and its state kept after. In the cohort's forward the dropout modules run in eval mode and
    the masks multiply their outputs: the products the sequential model forms. On a GPU the
    fused dropout kernel draws from the device's generator too, so the same holds there."""

    def __init__(self, model: nn.Module, device: torch.device):
        self.model = model
        self.modules = {name: m for name, m in model.named_modules() if isinstance(m, _DropoutNd)}
        self.drawers = {name: copy.deepcopy(m).train() for name, m in self.modules.items()}
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.generator = torch.cuda.default_generators[index]
        else:
            self.generator = torch.random.default_generator
        self._calls: dict[tuple, list[tuple]] = {}  # one client's batch → the dropout calls
        self._pending: Iterator[torch.Tensor] | None = None

    def streams(self, seeds: list[int]) -> list[torch.Tensor]:
        """Each member's generator state at the start of its fit (``seed_global``'s seeding)."""
        states = []
        for seed in seeds:
            self.generator.manual_seed(seed)
            states.append(self.generator.get_state())
        return states

    def draw(self, streams: list[torch.Tensor], clients: list[int],
             x: torch.Tensor) -> list[torch.Tensor]:
        """The masks of one step of ``clients`` (inputs ``x``, clients × batch × …), one stacked
        tensor per dropout call in the order the forward makes them; each client's stream
        advances as its sequential step advances it."""
        calls = self._calls_on(x[0])
        drawn = []
        for c in clients:
            self.generator.set_state(streams[c])
            drawn.append([self.drawers[name](
                torch.empty_strided(size, stride, dtype=dtype, device=x.device).fill_(1.0))
                for name, size, stride, dtype in calls])
            streams[c] = self.generator.get_state()
        return [torch.stack([masks[i] for masks in drawn]) for i in range(len(calls))]

    def _calls_on(self, batch: torch.Tensor) -> list[tuple]:
        """(module name, size, stride, dtype) of each dropout call of the sequential model on a
        batch shaped as ``batch``, in order: the model run once in eval mode per batch shape."""
        key = (tuple(batch.shape), batch.dtype)
        if key not in self._calls:
            calls = []
            hooks = [m.register_forward_pre_hook(
                lambda _m, args, name=name: calls.append(
                    (name, args[0].shape, args[0].stride(), args[0].dtype)))
                for name, m in self.modules.items()]
            try:
                with torch.no_grad(), evaluating(self.model):
                    self.model(batch.new_zeros(batch.shape))
            finally:
                for hook in hooks:
                    hook.remove()
            self._calls[key] = calls
        return self._calls[key]

    @contextmanager
    def replacing(self):
        """While a fit runs: the dropout modules in eval mode (they draw nothing), each output
        multiplied by the next of the masks ``applying`` hands out."""
        modes = {name: m.training for name, m in self.modules.items()}
        hooks = [m.register_forward_hook(self._masked) for m in self.modules.values()]
        for m in self.modules.values():
            m.eval()
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()
            for name, m in self.modules.items():
                m.training = modes[name]

    @contextmanager
    def applying(self, masks: list[torch.Tensor]):
        """The forward run in this block multiplies its dropout calls' outputs by ``masks``, in
        order (one client's, or under ``vmap`` every client's)."""
        self._pending = iter(masks)
        try:
            yield
        finally:
            self._pending = None

    def _masked(self, _module, _args, output):
        if self._pending is not None:
            return output * next(self._pending)
        return None


class BatchedLayers:
    """The model's forward over stacked parameters, layer by layer: a Linear becomes one
    ``baddbmm`` over all clients, a Conv2d one grouped convolution and a BatchNorm one batch
    norm with the clients side by side in the channel dimension (so each channel's batch and
    running statistics are one client's), a dropout a product with each client's mask;
    activations, pooling and flattening act on the merged batch. One ordinary autograd pass
    then yields every client's gradient. For small models this is several times cheaper per
    step than ``vmap`` over ``functional_call``, whose per-call bookkeeping costs more than the
    arithmetic; models with other layers, or whose forward is not their modules in a row (a
    residual block), use ``vmap``."""

    ELEMENTWISE = (nn.ReLU, nn.Identity)
    LEAVES = (nn.Linear, nn.Conv2d, nn.MaxPool2d, nn.Flatten, nn.BatchNorm1d, nn.BatchNorm2d,
              _DropoutNd, *ELEMENTWISE)

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
        """Whether the model is its leaves run in a row (every container an ``nn.Sequential``)
        and each leaf is one of ``LEAVES``."""
        inner = [m for m in model.modules() if m is not model]
        return all(isinstance(m, nn.Sequential) if any(True for _ in m.children())
                   else isinstance(m, cls.LEAVES) for m in inner)

    def __call__(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                 masks: Iterator[torch.Tensor] | None = None) -> torch.Tensor:
        """``x`` is (clients, batch, *sample); the output (clients, batch, outputs). ``params``
        hold the parameters and the running statistics by slot name; ``masks`` the dropout
        masks in call order (``ClientDropout.draw``), none in eval mode."""
        return self.head(params, self.features(params, x, masks), masks)

    def features(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                 masks: Iterator[torch.Tensor] | None = None) -> torch.Tensor:
        """The encoder's output (clients, batch, …)."""
        return self._run("encoder", params, x, masks)

    def head(self, params: dict[str, torch.Tensor], features: torch.Tensor,
             masks: Iterator[torch.Tensor] | None = None) -> torch.Tensor:
        """The head's output (clients, batch, outputs) on the features."""
        return self._run("head", params, features, masks)

    def _run(self, part: str, params, x, masks):
        for prefix, module in self.parts[part]:
            x = self._apply(module, prefix, params, x, masks)
        return x

    @staticmethod
    def _apply(module: nn.Module, prefix: str, params, x, masks):
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
        if isinstance(module, _BatchNorm):
            return _batch_norm(module, prefix, params, x)
        if isinstance(module, _DropoutNd):
            return x if masks is None else x * next(masks)
        if isinstance(module, nn.MaxPool2d):
            out = F.max_pool2d(x.flatten(0, 1), module.kernel_size, module.stride,
                               module.padding, module.dilation, module.ceil_mode)
            return out.view(*x.shape[:2], *out.shape[1:])
        if isinstance(module, nn.Flatten):
            return x.flatten(module.start_dim + 1, module.end_dim)
        return module(x)


def _batch_norm(module: _BatchNorm, prefix: str, params, x: torch.Tensor) -> torch.Tensor:
    """``module``'s forward (``_BatchNorm.forward``'s arithmetic) on stacked clients: their
    channels side by side, so batch statistics are taken per client and channel, and each
    client's running statistics (rows of contiguous stacked tensors, updated in place through
    the flattened views) are its own. A GPU convolution's output is laid out so already."""
    clients, batch = x.shape[:2]
    merged = x.transpose(0, 1).reshape(batch, -1, *x.shape[3:])

    def side_by_side(name: str) -> torch.Tensor | None:
        tensor = params.get(prefix + name)
        return None if tensor is None else tensor.reshape(-1)

    mean, var = side_by_side("running_mean"), side_by_side("running_var")
    out = F.batch_norm(merged, mean, var, side_by_side("weight"), side_by_side("bias"),
                       module.training or (mean is None and var is None),
                       module.momentum or 0.0, module.eps)
    return out.view(batch, clients, *x.shape[2:]).transpose(0, 1)


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
        with torch.no_grad(), evaluating(model):
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
        self.statistics = [s for s in self.layout.slots if not s.is_param]  # running statistics
        self.part_of = {s.name: s.name.split(".", 1)[0] for s in self.params}
        model = trainer.model
        # integer buffers (BatchNorm's batch counters) are not in the layout: a fit counts on
        # copies of its own, and the worker's model keeps its own (no result depends on them)
        self.counters = {name: b for name, b in model.named_buffers()
                         if name not in {s.name for s in self.statistics}}
        self.layers = BatchedLayers(model) if BatchedLayers.supports(model) else None
        self.dropout = ClientDropout(model, trainer.device) \
            if any(isinstance(m, _DropoutNd) for m in model.modules()) else None
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
            with torch.no_grad(), evaluating(model):
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
        everyone steps). The model runs in train mode as in the sequential fit: each member's
        running statistics (of every part, trained or not) move with its own batches, and its
        dropout masks come from its own stream. A member's loss terms and after-step map are its
        own functions of its own rows."""
        trainer = self.trainer
        device, batch = trainer.device, trainer.batch_size
        cfg = optimizer or trainer.optimizer
        if epochs is None and max_steps is None:
            epochs = trainer.local_epochs
        flat = torch.stack([m.start for m in members]).to(device)
        trained = [s for s in self.params if self.part_of[s.name] in trainable]
        frozen = [s for s in self.params if self.part_of[s.name] not in trainable]
        weights, fixed = self._stacked(flat, trained), self._stacked(flat, frozen)
        buffers = self._buffers(flat)
        names = list(weights)
        prox = members[0].anchor is not None
        anchors = self._stacked(torch.stack([m.anchor for m in members]).to(device), trained) \
            if prox else {}
        references = {name: self._stacked(torch.stack([m.references[name] for m in members])
                                          .to(device), self.layout.slots)
                      for name in members[0].references}
        state = sgd.zero_state([weights[k] for k in names], cfg)
        state = {} if state is None else dict(zip(names, state))
        step_fn = self._gradients(loss_fn)
        schedules = [self._schedule(split, m, batch, epochs, max_steps, device)
                     for m in members]
        streams = self.dropout.streams([m.seed for m in members]) if self.dropout else None
        totals = torch.zeros(len(members), device=device)
        steps, samples = [0] * len(members), [0] * len(members)
        trainer.model.train()
        with self.dropout.replacing() if self.dropout else nullcontext():
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
                    x = split.x[rows]
                    y = split.y[rows] if targets == "labels" else {
                        k: v[rows] for k, v in split.tasks.items()}
                    current, resting, pinned, moving = \
                        take(weights), take(state), take(fixed), take(buffers)
                    masks = self.dropout.draw(streams, clients, x) if self.dropout else []
                    if any(members[c].terms for c in clients):
                        grads, losses = self._with_terms(
                            loss_fn, current, pinned, moving, masks, x, y,
                            [members[c].terms for c in clients],
                            {name: take(tree) for name, tree in references.items()})
                    else:
                        grads, losses = step_fn(current, pinned, moving, masks, x, y)
                    pulls = take(anchors)
                    sgd.step_([current[k] for k in names], [grads[k] for k in names],
                              [resting[k] for k in names] if state else None, cfg, step=t + 1,
                              anchors=[pulls[k] for k in names] if prox else None, mu=mu)
                    if not whole:  # the group's rows were gathered: write them back
                        for tree, rows_of_group in ((weights, current), (state, resting),
                                                    (buffers, moving)):
                            for k, v in rows_of_group.items():
                                tree[k].index_copy_(0, index, v)
                    for c in clients:
                        if members[c].after_step is not None:
                            self._after_step(members[c].after_step, weights, fixed, c, cfg.lr)
                    totals.index_add_(0, index, losses.detach())
                    for c in clients:
                        steps[c] += 1
                        samples[c] += size
        for s in trained + self.statistics:
            source = weights if s.is_param else buffers
            flat[:, s.offset: s.offset + s.numel] = source[s.name].reshape(len(members), -1)
        results = [FitResult(float(totals[c]) / max(steps[c], 1), steps[c], samples[c])
                   for c in range(len(members))]
        return flat, results

    @staticmethod
    def _stacked(source: torch.Tensor, slots) -> dict[str, torch.Tensor]:
        """The ``slots`` of stacked flat vectors (clients × P) as stacked tensors by name."""
        return {s.name: source[:, s.offset: s.offset + s.numel].reshape(-1, *s.shape)
                for s in slots}

    def _buffers(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every member's buffers, which its forward updates in place: the running statistics
        of its start vector and copies of the model's batch counters, each a contiguous stack
        (clients × …) so that a client's rows, flattened side by side, are views."""
        clients = len(flat)
        return {**{name: stack.contiguous()
                   for name, stack in self._stacked(flat, self.statistics).items()},
                **{name: b.expand(clients, *b.shape).clone() for name, b in self.counters.items()}}

    def _forward(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                 masks: list[torch.Tensor] | None = None) -> Forward:
        """Every client's features and outputs (clients × batch × …) with its own rows of
        ``params`` (parameters and buffers) and of the dropout ``masks`` (None in eval mode):
        layer by layer when the model allows, else one client at a time."""
        masks = masks or None
        if self.layers is not None:
            pending = None if masks is None else iter(masks)
            features = self.layers.features(params, x, pending)
            return Forward(features, self.layers.head(params, features, pending))
        forwards = []
        for c in range(len(x)):
            with self._applying(None if masks is None else [m[c] for m in masks]):
                forwards.append(forward_with(self.trainer.model,
                                             {k: v[c] for k, v in params.items()}, x[c]))
        return Forward(torch.stack([f.features for f in forwards]),
                       torch.stack([f.outputs for f in forwards]))

    def _applying(self, masks: list[torch.Tensor] | None):
        """A block whose forward multiplies the dropout calls' outputs by ``masks`` (None: an
        eval-mode forward, which draws none)."""
        return self.dropout.applying(masks) if self.dropout and masks is not None \
            else nullcontext()

    def _with_terms(self, loss_fn, current, pinned, moving, masks, x, y, terms, references):
        """(gradients, per-client data losses) of each client's data loss plus its own loss
        terms, from one forward pass of the group; the terms see each client's rows only, as
        the sequential fit hands them its ``Batch``, and the reference models run in eval mode
        on their own running statistics, as ``reference_forward`` runs them."""
        leaves = {k: v.detach().requires_grad_(True) for k, v in current.items()}
        params = {**leaves, **pinned}
        ours = self._forward({**params, **moving}, x, masks)
        with torch.no_grad(), evaluating(self.trainer.model):
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
        (clients × n × sample), in eval mode (each client's running statistics, no dropout):
        evaluation of personal models in one batched pass."""
        params = self._stacked(vectors, self.layout.slots)
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
        """(trained params, frozen params, buffers, dropout masks, x, y) of a group →
        (gradients, per-client losses); the buffers are updated in place."""
        if self.layers is None:
            model = self.trainer.model

            def loss_of(train_params, frozen_params, buffers, masks, x, y):
                with self._applying(masks):
                    outputs = functional_call(model, {**train_params, **frozen_params, **buffers},
                                              (x,))
                return loss_fn(outputs, y)

            return vmap(grad_and_value(loss_of))

        def batched(train_params, frozen_params, buffers, masks, x, y):
            leaves = {k: v.detach().requires_grad_(True) for k, v in train_params.items()}
            out = self.layers({**leaves, **frozen_params, **buffers}, x, iter(masks))
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
