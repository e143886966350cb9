"""The two halves every method implements, and the defaults most methods share.

Server half (runs in the coordinator): ``server_init``, ``server_setup``, ``select``,
``broadcast``, ``extras``, ``aggregate``, ``collect`` / ``receive_reports``. Client half (runs in a
worker, once per virtual client): ``client_init``, ``setup``, ``local_update``, ``report``,
``deployable``, ``evaluate``.

A round: ``select`` → ``broadcast`` (+ ``extras``) → ``local_update`` on each participant →
``aggregate``; then, when ``collect`` returns a payload, every client (not only participants)
sends a ``report`` and the server folds them in with ``receive_reports`` (HDC-FL's refresh,
FedSoft's importance estimation); then evaluation. Before round 1, methods that define
``setup`` get one upload from every client (round 0 of the rounds table). Both are
plain functions of tensors and dicts; nothing here imports Ray, so a method is unit-testable on
its own and runs unchanged on every backend.

What the validator and the runtime must know of a method before anything runs is declared on
its class: ``check`` (problems of a spec only the method sees), ``build_model`` (the model's
shape), ``evaluation`` (how clients are scored), ``requires``, ``personal_state`` and the
other class attributes below.

Every hook that belongs to a round is told its number ``rnd``: server hooks as a positional
argument, client hooks (``plan``, ``local_update``, ``report``, ``evaluate``) as a
keyword. A method never needs to carry the round in its payloads (where it would be counted as
bytes on the wire) or in its server state (where a checkpoint would have to keep it). Evaluation
after round r sends what round r + 1 would (``broadcast`` and ``extras`` get r + 1) and scores
it with ``evaluate(…, rnd=r)``.

What a client uploads is a dict of tensors. A plain tensor reaches the server stacked with the
other senders' (``Uploads.tensors``); a ``Share`` is a term of a weighted sum per group that the
workers reduce (``Uploads.mean(key, group)``), so clustered methods never pull one vector per
client to the server. Keys in ``averaged`` are shares of weight n_k in group 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict

from raylf.config import ExperimentSpec
from raylf.data.federation import ClientData, Federation
from raylf.models import SplitModel
from raylf.registry import Registry
from raylf.seeding import derive
from raylf.training.layout import PARTS, ParamLayout
from raylf.training.sequential import AfterStep, LocalTrainer, LossFn, Penalty

Tensors = dict[str, torch.Tensor]


class MethodParams(BaseModel):
    """Hyperparameters of a method; subclasses declare them with types, bounds and defaults."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # finite numbers only


@dataclass(frozen=True)
class MethodContext:
    """What both halves may know about the experiment (never another client's data).

    ``latent_groups`` are the scenario's true group labels (None when it has none): only
    reference methods that declare ``requires = {"groups"}`` (oracles) may read them.
    ``draw_init(i)`` builds model ``i``'s flat initialization through the model factory, seeded
    from the trial seed (IFCA's and FedSoft's distinct cluster models); the common init every
    client starts from is the ``init`` handed to ``server_init`` and ``client_init``.
    """

    layout: ParamLayout
    num_clients: int
    n_train: np.ndarray
    num_classes: int
    rounds: int
    participants_per_round: int
    seed: int
    latent_groups: np.ndarray | None = None
    draw_init: Callable[[int], torch.Tensor] | None = None

    def initial_models(self, count: int) -> torch.Tensor:
        """``count`` independently drawn initializations, stacked (count, P)."""
        assert self.draw_init is not None, "this context was built without a model factory"
        return torch.stack([self.draw_init(i) for i in range(count)])


@dataclass(frozen=True)
class Share:
    """One client's term of a weighted sum per group: Σ_k w_kg v_k and Σ_k w_kg are reduced on
    the workers. ``weights`` maps group → weight (one entry: hard assignment; several: soft)."""

    value: torch.Tensor
    weights: dict[int, float]


def share(value: torch.Tensor, weight: float, group: int = 0) -> Share:
    """``value`` counted with ``weight`` in one group (IFCA: its chosen model, n_k)."""
    return Share(value, {int(group): float(weight)})


def soft_share(value: torch.Tensor, weights: Sequence[float] | torch.Tensor) -> Share:
    """``value`` counted in every group g with weight ``weights[g]`` (zero weights dropped):
    FedSoft's importance-weighted cluster sums, HDC-FL's π_kg·n_k prototypes."""
    return Share(value, {g: float(w) for g, w in enumerate(weights) if float(w) != 0.0})


def weighted_mean(stacked: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ_k w_k v_k / Σ_k w_k over the rows of ``stacked`` in one matrix-vector product."""
    w = weights.to(stacked.dtype)
    return (w / w.sum()) @ stacked


@dataclass
class Uploads:
    """What the server receives in one round (or the setup phase), in ascending client order.

    ``tensors[key]`` stacks the per-client uploads of ``key`` from the clients in
    ``senders[key]`` (default: all of ``client_ids``; a client that did not upload ``key`` has
    no row). ``sums[key][g]`` and
    ``weights[key][g]`` are the workers' reductions of the ``Share`` uploads: float64 sums, so
    the result does not depend on how clients were spread over workers.
    """

    client_ids: np.ndarray
    n_train: torch.Tensor
    tensors: Tensors = field(default_factory=dict)
    senders: dict[str, np.ndarray] = field(default_factory=dict)
    sums: dict[str, dict[int, torch.Tensor]] = field(default_factory=dict)
    weights: dict[str, dict[int, float]] = field(default_factory=dict)

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.sums

    def groups(self, key: str) -> list[int]:
        """Groups that received at least one share of ``key`` this round."""
        return sorted(self.sums.get(key, {}))

    def weight(self, key: str, group: int = 0) -> float:
        return self.weights.get(key, {}).get(group, 0.0)

    def mean(self, key: str, group: int = 0) -> torch.Tensor:
        """Σ w v / Σ w over the shares of ``key`` in ``group``; for a stacked key, the n_k-weighted
        mean over the clients that sent it."""
        if key in self.sums:
            if group not in self.sums[key]:
                raise KeyError(f"no client uploaded {key!r} for group {group} this round")
            return (self.sums[key][group] / self.weights[key][group]).float()
        rows = np.searchsorted(self.client_ids, self.senders.get(key, self.client_ids))
        return weighted_mean(self.tensors[key], self.n_train[torch.as_tensor(rows)])


@dataclass
class FitPlan:
    """A local update of the common shape, declared rather than run: start from ``start`` (the
    flat vector assembled from what was received and the personal state), fit the ``trainable``
    parts on the client's training data, then turn the trained vector into the update with
    ``finish``. The runtime runs a plan itself — one client at a time, or many in lockstep
    (cohort training) — so a method that declares its update this way is cohort-trained without
    any cohort code of its own, and ``raylf.testing`` checks that both give the same result.

    The fit is ``LocalTrainer.fit``'s: ``epochs`` passes (None: the federation's local epochs,
    or as many as ``max_steps`` take), cut after ``max_steps`` optimizer steps; a proximal pull
    ``mu``·(w − ``anchor``); ``penalty``, a differentiable term of the parameters added to the
    loss; ``after_step``, a map of the parameters applied after every step (a proximal map for a
    term kept out of the loss). Its minibatches are shuffled by the client's round seed, or by
    ``derive(seed, "method", *seed_stream)`` for a fit that must not repeat another's order.
    ``finish`` may return the next plan instead of the update: a client's update of several
    fits (Ditto's personal model, then its copy of the global one) runs them in turn, each
    stage of a cohort in lockstep."""

    start: torch.Tensor
    finish: Callable[[torch.Tensor], ClientUpdate | FitPlan]
    trainable: tuple[str, ...] = PARTS
    anchor: torch.Tensor | None = None
    mu: float = 0.0
    loss_fn: LossFn = F.cross_entropy
    targets: Literal["labels", "tasks"] = "labels"  # tasks: {task: labels} for multi-task losses
    epochs: int | None = None
    max_steps: int | None = None
    penalty: Penalty | None = None
    after_step: AfterStep | None = None
    seed_stream: tuple[int, ...] | None = None

    def shape(self) -> tuple:
        """What clients must share to train in one cohort (the anchor, strength, penalty and
        after-step map are each member's own)."""
        return (self.trainable, self.anchor is not None, self.loss_fn, self.targets,
                self.epochs, self.max_steps)

    def seed(self, seed: int) -> int:
        """The fit's shuffling seed from the client's round seed."""
        return seed if self.seed_stream is None else derive(seed, "method", *self.seed_stream)


def run_plan(trainer: LocalTrainer, plan: FitPlan, data: ClientData, seed: int) -> ClientUpdate:
    """A plan executed for one client (the sequential path), stage after stage."""
    step: ClientUpdate | FitPlan = plan
    while isinstance(step, FitPlan):
        trainer.load(step.start)
        targets = data.y_train if step.targets == "labels" else dict(data.tasks_train)
        prox = None if step.anchor is None else (step.anchor, step.mu)
        trainer.fit(data.x_train, targets, seed=step.seed(seed), trainable=step.trainable,
                    epochs=step.epochs, max_steps=step.max_steps, prox=prox,
                    loss_fn=step.loss_fn, penalty=step.penalty, after_step=step.after_step)
        step = step.finish(trainer.vector())
    return step


@dataclass
class ClientUpdate:
    """A client's upload and its new personal state. Its losses are not reported here: the
    trainer logs every fit and gradient the update runs, and the runtime checks them all."""

    upload: dict[str, torch.Tensor | Share]
    personal: Any = None
    metrics: dict[str, float] = field(default_factory=dict)


class Method:
    name: ClassVar[str]
    Params: ClassVar[type[MethodParams]] = MethodParams
    round_unit: ClassVar[Literal["round", "step"]] = "round"
    """What ``federation.rounds`` counts: federated rounds, or single optimizer steps (the
    per-step methods of ``raylf.methods.perstep``). Written to the trials table
    (``round_unit``), so a reader of results alone (``raylf.report``) converts steps to epochs
    without importing the methods."""
    personal_state: ClassVar[bool] = False
    """True when clients keep resident state (a private head, a personal model) across rounds.
    It lives in the hosting worker's CPU memory and visits the device only while its client
    trains or is evaluated."""
    evaluation: ClassVar[Literal["shared", "per_client", "own"]] = "per_client"
    """How the runtime scores clients, declared so it need not guess from the overrides.

    - ``shared``: every client with the same broadcast model (``deployable(payload, None,
      None)``), one forward pass per block of clients; ``evaluate`` is never called.
    - ``per_client``: each client's ``deployable`` scored like the default ``evaluate`` (one
      row, task ``main``), so the runtime may score many clients in one batched pass (cohort
      evaluation) when it trains in cohorts.
    - ``own``: the method's ``evaluate`` override, one client at a time (rows per task,
      several deployables, fine-tuning before scoring).

    A method that overrides ``evaluate`` declares ``own``; ``raylf.testing.check_method``
    refuses a declaration that disagrees with the override."""
    averaged: ClassVar[frozenset[str]] = frozenset()
    """Upload keys sent as plain tensors but read only through ``Uploads.mean``: each is a
    ``share`` of weight n_k in group 0. The round's return message and the server's memory stop
    growing with participants; bytes up still count per client."""
    deployables: ClassVar[tuple[str, ...]] = ("main",)
    """Names of the models a client is evaluated with (clients-table column ``deployable``).
    The first is the method's reported model (``acc_*``); others get an ``_<name>`` suffix."""
    requires: ClassVar[frozenset[str]] = frozenset()
    """What the scenario must provide: ``tasks`` (a multi-task dataset), ``groups`` (latent
    group labels, for oracles). Checked before anything starts."""
    smoke_params: ClassVar[dict[str, int]] = {}
    """Caps a smoke run (raylf.sweep.smoke) puts on parameters that count extra work (passes,
    epochs) without changing which code runs: each parameter set above its cap is lowered to it."""

    def __init__(self, params: MethodParams, ctx: MethodContext):
        self.params = params
        self.ctx = ctx

    @classmethod
    def check(cls, spec: ExperimentSpec) -> list[tuple[str, str]]:
        """Problems of ``spec`` that only this method sees, as (field, message) pairs naming
        the fix; none by default. ``raylf.config.validate`` calls it once the spec's structure
        and the method's params (``spec.method.hparams``) are valid and reports what it returns
        together with every other error of the spec, so a user fixes them all in one go.
        Only what the spec alone decides belongs here: a problem that needs the data (the
        dataset's labels, a split the data fixes) or the built model is raised where those are
        known (``build_model``, the constructor)."""
        return []

    @classmethod
    def build_model(cls, spec_model: Callable[[int], SplitModel], federation: Federation,
                    params: MethodParams) -> SplitModel:
        """The model the server and every client start from (``raylf.runtime.Blueprint``).

        ``spec_model(outputs)`` builds the spec's model through the model factory with that
        many head outputs; ``params`` are the method's. By default the spec's model with one
        output per class; a method overrides this to shape the model itself (a head per task,
        no encoder, a linear feature layer)."""
        return spec_model(federation.num_classes)

    @property
    def has_setup(self) -> bool:
        """Whether the method runs a one-shot setup phase (it overrides ``setup``)."""
        return type(self).setup is not Method.setup

    # ---- server half ---------------------------------------------------------------------
    def server_init(self, init: torch.Tensor) -> dict[str, Any]:
        raise NotImplementedError

    def server_setup(self, state: dict[str, Any], uploads: Uploads) -> dict[str, Any]:
        """Server state after the setup phase's uploads (every client's, once, before round 1)."""
        return state

    def select(self, state: dict[str, Any], rnd: int, rng: np.random.Generator) -> np.ndarray:
        """Uniform sampling without replacement from the round's participation stream."""
        chosen = rng.choice(self.ctx.num_clients, self.ctx.participants_per_round, replace=False)
        return np.sort(chosen)

    def broadcast(self, state: dict[str, Any], rnd: int) -> Tensors:
        raise NotImplementedError

    def extras(self, state: dict[str, Any], client_ids: np.ndarray,
               rnd: int) -> dict[int, Any]:
        """Small per-client messages next to round ``rnd``'s broadcast (a cluster id, mixture
        weights), or next to its ``collect`` payload in the collect phase."""
        return {}

    def aggregate(self, state: dict[str, Any], uploads: Uploads,
                  rnd: int) -> tuple[dict[str, Any], dict[str, float]]:
        """New server state and this round's diagnostics (rounds-table columns)."""
        raise NotImplementedError

    def collect(self, state: dict[str, Any], rnd: int) -> Tensors | None:
        """After round ``rnd``'s aggregation: None (the default), or the payload every client
        receives to compute its ``report`` (``extras`` adds per-client messages)."""
        return None

    def receive_reports(self, state: dict[str, Any], uploads: Uploads,
                        rnd: int) -> tuple[dict[str, Any], dict[str, float]]:
        """New server state from every client's report, and diagnostics for round ``rnd``."""
        return state, {}

    def tables(self, state: dict[str, Any], rnd: int) -> dict[str, list[dict[str, Any]]]:
        """Rows of method-defined tables after round ``rnd`` (SP-CACW's α per target), keyed by
        table name; the runtime adds ``trial_id`` and ``round`` and writes
        ``tables/<name>/<trial_id>.parquet`` beside the three standard tables."""
        return {}

    # ---- client half ---------------------------------------------------------------------
    def client_init(self, cid: int, init: torch.Tensor) -> Any:
        return None

    def setup(self, trainer: LocalTrainer, data: ClientData, seed: int) -> dict[str, Any]:
        """The one-shot upload computed from a client's own training data before round 1
        (PACFL's subspace bases, FedDisco's label histograms); counted in bytes like any."""
        return {}

    def plan(self, payload: Tensors, personal: Any, data: ClientData, extra: Any, *,
             rnd: int) -> FitPlan:
        """The local update declared as a ``FitPlan`` (then ``local_update`` need not be
        written, and the runtime may train clients in cohorts)."""
        raise NotImplementedError

    @property
    def plans_updates(self) -> bool:
        """Whether the local update is declared by ``plan`` (and may run in cohorts)."""
        cls = type(self)
        return cls.plan is not Method.plan and cls.local_update is Method.local_update

    def local_update(self, trainer: LocalTrainer, payload: Tensors, personal: Any,
                     data: ClientData, seed: int, extra: Any, *, rnd: int) -> ClientUpdate:
        """Train from what was received; by default the method's ``plan``, run for this client.
        Override for updates a plan cannot declare: work on the trainer before the fit (a
        choice among models, a weight learning), gradients without a fit (the per-step
        methods); the method's docstring then says why."""
        return run_plan(trainer, self.plan(payload, personal, data, extra, rnd=rnd), data, seed)

    def report(self, trainer: LocalTrainer, payload: Tensors, personal: Any, data: ClientData,
               seed: int, extra: Any, *, rnd: int) -> ClientUpdate:
        """What a client sends when the server collects (its upload may hold shares), and its
        personal state afterwards (FedSoft keeps the importance weights it estimated)."""
        raise NotImplementedError

    def deployable(self, payload: Tensors, personal: Any, extra: Any) -> torch.Tensor:
        """The flat parameter vector this client is evaluated with."""
        raise NotImplementedError

    def evaluate(self, trainer: LocalTrainer, payload: Tensors, personal: Any, data: ClientData,
                 extra: Any, *, rnd: int, seed: int) -> list[dict[str, Any]]:
        """Clients-table rows for one client on ``data``'s evaluation split (``x_test``):
        one row per task and deployable. ``seed`` (of this client, round and split) seeds any
        randomness, e.g. FedBABU's fine-tuning; nothing done here persists."""
        return [scored_model(trainer, self.deployable(payload, personal, extra), data)]


METHODS: Registry[type[Method]] = Registry("method")


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: make a method available to specs under its ``name``."""
    METHODS.register(cls.name)(cls)
    return cls


def score(logits: torch.Tensor, y: torch.Tensor, task: str = "main") -> dict[str, Any]:
    n = len(y)
    if n == 0:
        return {"task": task, "n_test": 0, "correct": 0, "accuracy": None, "loss": None}
    correct = int((logits.argmax(1) == y).sum())
    loss = float(F.cross_entropy(logits, y))
    return {"task": task, "n_test": n, "correct": correct, "accuracy": correct / n, "loss": loss}


def scored_model(trainer: LocalTrainer, model: torch.Tensor, data: ClientData) -> dict[str, Any]:
    """The flat vector ``model`` scored on the client's evaluation split: one row, task main."""
    trainer.load(model)
    return score(trainer.predict(data.x_test), data.y_test)
