r"""The two halves every method implements, and the defaults most methods share.

Server half (runs in the coordinator): ``server_init``, ``server_setup``, ``select``,
``broadcast``, ``extras``, ``aggregate``, ``tables``. Client half (runs in a worker, once per
virtual client): ``client_init``, ``setup``, ``plan`` (or ``local_update``) and ``deploy``.

A round: ``select`` → ``broadcast`` (+ ``extras``) → each participant's local update →
``aggregate``; then each of the method's later ``phases`` in turn (a ``Phase``: the server
requests, the clients it asks answer, the server folds the answers in: HDC-FL's refresh,
FedSoft's importance estimation, the per-step learners' own step); then evaluation, where the
runtime scores every model a client ``deploy``\ s. Before round 1, methods that define
``setup`` get one upload from every client (round 0 of the rounds table). Both halves are
plain functions of tensors and dicts; nothing here imports Ray, so a method is unit-testable on
its own and runs unchanged on every backend.

Every client hook takes one argument, a ``ClientRound``: what was received (``payload``,
``extra``), the client's ``personal`` state and ``data``, the hook's ``seed`` and round
``rnd``, the federation's ``optimizer`` settings and the ``trainer``; server hooks get the
round ``rnd`` as an argument. A method never needs to carry the round in its payloads (where it
would be counted as bytes on the wire) or in its server state (where a checkpoint would have to
keep it). Evaluation after round r sends what round r + 1 would (``broadcast`` and ``extras``
get r + 1) and scores what ``deploy`` returns for round r.

What the validator and the runtime must know of a method before anything runs is declared on
its class: ``check`` (problems of a spec only the method sees), ``build_model`` (the model's
shape), ``evaluation`` and ``deployables`` (what clients are scored with), ``requires``,
``personal_state`` and the other class attributes below.

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

from raylf.data.federation import ClientData, Federation
from raylf.models import SplitModel
from raylf.registry import Registry
from raylf.schema import ExperimentSpec, OptimizerSpec
from raylf.seeding import derive
from raylf.training.layout import PARTS, ParamLayout
from raylf.training.objective import LossTerm
from raylf.training.sequential import AfterStep, LocalTrainer, LossFn
from raylf.training.sgd import step_count

Tensors = dict[str, torch.Tensor]
State = dict[str, Any]
"""The server half's state: a dict of tensors and numbers (what a checkpoint keeps)."""
Personal = torch.Tensor | dict[str, Any] | None
"""A client's resident state between rounds (``personal_state``): a tensor, or a dict of tensors
and numbers (what ``torch.load(weights_only=True)`` restores from a checkpoint); None for a
method without one."""
Message = torch.Tensor | dict[str, Any] | float | int | bool | None
"""A per-client message next to a payload (``extras``, a phase's ``messages``): a cluster id,
mixture weights, a direction; None when the server sends the client none."""


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
    ``batch_size`` and ``local_epochs`` are the federation's local schedule (defaults: the
    spec's), so a method that reads what a fit did from its length (SCAFFOLD's control
    variates: the displacement over the step count) knows it without the trainer.
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
    batch_size: int = 32
    local_epochs: int = 1

    def local_steps(self, n: int) -> int:
        """Optimizer steps of a fit of the federation's schedule over ``n`` samples."""
        return step_count(n, self.batch_size, self.local_epochs)

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


@dataclass(frozen=True)
class ClientRound:
    """What a client hook sees, the same in every hook (``setup``, ``plan``, ``local_update``,
    a phase's ``answer``, ``deploy``): the one argument they take.

    ``payload`` and ``extra`` are what the server sent this client (the round's broadcast and
    per-client message, a phase's request and message, or at evaluation what the next round
    would send); ``personal`` is its resident state (``personal_state``), ``data`` its own
    samples; ``seed`` seeds any randomness of this hook for this client and round (the fit's
    shuffling, DP noise, fine-tuning), so results depend on nothing but the trial seed;
    ``optimizer`` holds the federation's local optimizer settings (a step's size is
    ``optimizer.lr``); ``trainer`` runs the model (loads, fits, gradients, predictions). A
    ``plan`` declares the update without running anything, so it must not use the trainer."""

    rnd: int
    data: ClientData
    seed: int
    trainer: LocalTrainer
    optimizer: OptimizerSpec
    payload: Tensors = field(default_factory=dict)
    personal: Personal = None
    extra: Message = None

    @property
    def cid(self) -> int:
        return self.data.cid


@dataclass(frozen=True)
class Deployment:
    """The models one client is scored with, by deployable name (a subset of the method's
    ``deployables``, in their order; none for a client with nothing to deploy), and the extra
    clients-table columns of each one's rows (a cluster id, importance weights)."""

    models: dict[str, torch.Tensor]
    columns: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Phase:
    """An exchange of a round after training, declared by the method (``Method.phases``).

    The server sends ``request(state, rnd)`` (None: the phase does not run this round) to the
    clients ``answering(state, rnd)`` selects (None: every client, not only the round's
    participants), each with its own ``messages(state, client_ids, rnd)`` entry as
    ``ClientRound.extra``; each of them runs ``answer`` and uploads what it returns (shares
    allowed) and keeps its new personal state; ``receive(state, uploads, rnd)`` folds the
    answers into the server state and gives rounds-table diagnostics. Phases run in the order
    declared, each on the state the one before left; bytes both ways count with the round's."""

    name: str
    request: Callable[[State, int], Tensors | None]
    answer: Callable[[ClientRound], ClientUpdate]
    receive: Callable[[State, Uploads, int], tuple[State, dict[str, float]]]
    messages: Callable[[State, np.ndarray, int], dict[int, Message]] | None = None
    answering: Callable[[State, int], np.ndarray] | None = None


@dataclass
class FitPlan:
    """A local update of the common shape, declared rather than run: start from ``start`` (the
    flat vector assembled from what was received and the personal state), fit the ``trainable``
    parts on the client's training data, then turn the trained vector into the update with
    ``finish``. The runtime runs a plan itself — one client at a time, or many in lockstep
    (cohort training) — so a method that declares its update this way is cohort-trained without
    any cohort code of its own, and ``raylf.testing`` checks that both give the same result.

    The fit is ``LocalTrainer.fit``'s: ``epochs`` passes (None: the federation's local epochs,
    or as many as ``max_steps`` take), cut after ``max_steps`` optimizer steps, with the
    federation's optimizer or ``optimizer`` (one of ``OptimizerSpec``'s declared set). The
    objective is the data loss ``loss_fn`` of the outputs and the ``targets`` plus each of
    ``terms``, functions of the step's ``Batch`` (``raylf.training.objective``: the inputs and
    targets, the model's features and outputs, the parameters, and the ``Forward`` of each of
    ``references``, frozen flat vectors by name: the global model, the previous local one);
    a proximal pull ``mu``·(w − ``anchor``) joins the gradient; ``after_step``, a map of the
    parameters applied after every step (a proximal map for a term kept out of the loss). Its
    minibatches are shuffled by the client's round seed, or by ``derive(seed, "method",
    *seed_stream)`` for a fit that must not repeat another's order. ``finish`` may return the
    next plan instead of the update: a client's update of several fits (Ditto's personal model,
    then its copy of the global one; head epochs, then body epochs) runs them in turn, each
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
    terms: tuple[LossTerm, ...] = ()
    references: dict[str, torch.Tensor] = field(default_factory=dict)
    after_step: AfterStep | None = None
    seed_stream: tuple[int, ...] | None = None
    optimizer: OptimizerSpec | None = None

    def shape(self) -> tuple:
        """What clients must share to train in one cohort (the anchor, strength, loss terms,
        reference models and after-step map are each member's own; their names are shared).
        Hashable: the optimizer, a pydantic model, enters as its JSON."""
        optimizer = None if self.optimizer is None else self.optimizer.model_dump_json()
        return (self.trainable, self.anchor is not None, self.loss_fn, self.targets,
                self.epochs, self.max_steps, tuple(sorted(self.references)), optimizer)

    def seed(self, seed: int) -> int:
        """The fit's shuffling seed from the client's round seed."""
        return seed if self.seed_stream is None else derive(seed, "method", *self.seed_stream)


def run_plan(plan: FitPlan, client: ClientRound) -> ClientUpdate:
    """A plan executed for one client (the sequential path), stage after stage."""
    trainer, data, seed = client.trainer, client.data, client.seed
    step: ClientUpdate | FitPlan = plan
    while isinstance(step, FitPlan):
        trainer.load(step.start)
        targets = data.y_train if step.targets == "labels" else dict(data.tasks_train)
        prox = None if step.anchor is None else (step.anchor, step.mu)
        trainer.fit(data.x_train, targets, seed=step.seed(seed), trainable=step.trainable,
                    epochs=step.epochs, max_steps=step.max_steps, prox=prox,
                    loss_fn=step.loss_fn, terms=step.terms, references=step.references,
                    after_step=step.after_step, optimizer=step.optimizer)
        step = step.finish(trainer.vector())
    return step


@dataclass
class ClientUpdate:
    """A client's upload and its new personal state. Its losses are not reported here: the
    trainer logs every fit and gradient the update runs, and the runtime checks them all."""

    upload: dict[str, torch.Tensor | Share]
    personal: Personal = None
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
    evaluation: ClassVar[Literal["shared", "per_client"]] = "per_client"
    """How the runtime scores clients, declared so it need not compare what they deploy.

    - ``shared``: every client deploys the same models (made from the broadcast alone): one
      forward pass over a block of clients per model;
    - ``per_client``: each client's own ``deploy``; the runtime scores many clients' models in
      one batched pass (cohort evaluation) when it trains in cohorts, else one at a time.

    ``raylf.testing.check_method`` refuses ``shared`` for a method whose clients deploy
    different models."""
    deployables: ClassVar[tuple[str, ...]] = ("main",)
    """Names of the models a client is scored with (clients-table column ``deployable``), the
    keys of ``deploy``'s models. The first is the method's reported model (``acc_*``); others
    get an ``_<name>`` suffix."""
    gain_over: ClassVar[str | None] = None
    """A second deployable the reported one is measured against: each row of the first gets
    ``accuracy_gain`` = its accuracy − this one's on the same split and task (the rounds
    table's ``acc_gain_mean``, HDC-FL's personalization gain)."""
    targets: ClassVar[Literal["labels", "tasks"]] = "labels"
    """What ``score`` is given: the split's labels, or its ``{task: labels}`` (a multi-task
    dataset, ``requires = {"tasks"}``)."""
    averaged: ClassVar[frozenset[str]] = frozenset()
    """Upload keys sent as plain tensors but read only through ``Uploads.mean``: each is a
    ``share`` of weight n_k in group 0. The round's return message and the server's memory stop
    growing with participants; bytes up still count per client."""
    requires: ClassVar[frozenset[str]] = frozenset()
    """What the scenario must provide: ``tasks`` (a multi-task dataset), ``groups`` (latent
    group labels, for oracles). Checked before anything starts."""
    oracle: ClassVar[bool] = False
    """A reference that reads what no deployable method can know (the scenario's latent
    groups): reports and claims never rank it among the methods and compare with it only where
    a claim names it."""
    proposed_in: ClassVar[str | None] = None
    """The title of the paper that proposes this method, for the methods raylf reproduces: the
    report's paired statistics compare every configuration with the best of them."""
    smoke_params: ClassVar[dict[str, int]] = {}
    """Caps a smoke run (raylf.sweep.smoke) puts on parameters that count extra work (passes,
    epochs) without changing which code runs: each parameter set above its cap is lowered to it."""

    def __init__(self, params: MethodParams, ctx: MethodContext):
        self.params = params
        self.ctx = ctx

    @classmethod
    def check(cls, spec: ExperimentSpec, params: MethodParams) -> list[tuple[str, str]]:
        """Problems of ``spec`` that only this method sees, as (field, message) pairs naming
        the fix; none by default. ``raylf.config.validate`` calls it once the spec's structure
        and the method's ``params`` are valid and reports what it returns together with every
        other error of the spec, so a user fixes them all in one go. Only what the spec alone
        decides belongs here: a problem that needs the data (the dataset's labels, a split the
        data fixes) or the built model is raised where those are known (``build_model``, the
        constructor)."""
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

    def phases(self) -> tuple[Phase, ...]:
        """The exchanges of a round after training, in order (none by default)."""
        return ()

    # ---- server half ---------------------------------------------------------------------
    def server_init(self, init: torch.Tensor) -> State:
        raise NotImplementedError

    def server_setup(self, state: State, uploads: Uploads) -> State:
        """Server state after the setup phase's uploads (every client's, once, before round 1)."""
        return state

    def select(self, state: State, rnd: int, rng: np.random.Generator) -> np.ndarray:
        """Uniform sampling without replacement from the round's participation stream."""
        chosen = rng.choice(self.ctx.num_clients, self.ctx.participants_per_round, replace=False)
        return np.sort(chosen)

    def broadcast(self, state: State, rnd: int) -> Tensors:
        raise NotImplementedError

    def extras(self, state: State, client_ids: np.ndarray, rnd: int) -> dict[int, Message]:
        """Small per-client messages next to round ``rnd``'s broadcast (a cluster id, mixture
        weights): to the participants in training, to every evaluated client at evaluation."""
        return {}

    def aggregate(self, state: State, uploads: Uploads,
                  rnd: int) -> tuple[State, dict[str, float]]:
        """New server state and this round's diagnostics (rounds-table columns)."""
        raise NotImplementedError

    def tables(self, state: State, rnd: int) -> dict[str, list[dict[str, Any]]]:
        """Rows of method-defined tables after round ``rnd`` (SP-CACW's α per target), keyed by
        table name; the runtime adds ``trial_id`` and ``round`` and writes
        ``tables/<name>/<trial_id>.parquet`` beside the three standard tables."""
        return {}

    # ---- client half ---------------------------------------------------------------------
    def client_init(self, cid: int, init: torch.Tensor) -> Personal:
        return None

    def setup(self, client: ClientRound) -> dict[str, Any]:
        """The one-shot upload computed from a client's own training data before round 1
        (PACFL's subspace bases, FedDisco's label histograms); counted in bytes like any."""
        return {}

    def plan(self, client: ClientRound) -> FitPlan:
        """The local update declared as a ``FitPlan`` (then ``local_update`` need not be
        written, and the runtime may train clients in cohorts)."""
        raise NotImplementedError

    @property
    def plans_updates(self) -> bool:
        """Whether the local update is declared by ``plan`` (and may run in cohorts)."""
        cls = type(self)
        return cls.plan is not Method.plan and cls.local_update is Method.local_update

    def local_update(self, client: ClientRound) -> ClientUpdate:
        """Train from what was received; by default the method's ``plan``, run for this client.
        Override for updates a plan cannot declare: work on the trainer before the fit (a
        choice among models, a weight learning), gradients without a fit (the per-step
        methods), a loop whose gradients are taken at other points than the trained parameters
        (APFL's mixed model, Per-FedAvg's adapted one); the method's docstring then says why."""
        return run_plan(self.plan(client), client)

    def deploy(self, client: ClientRound) -> Deployment:
        """The models this client is scored with (what evaluation after round ``client.rnd``
        received) and their rows' extra columns. May use the trainer on the client's own
        training data to decide (IFCA's choice of cluster, FedALA's adaptation, FedBABU's
        fine-tuning); nothing done here persists."""
        raise NotImplementedError

    def scores(self, outputs: torch.Tensor, targets: torch.Tensor | dict[str, torch.Tensor]
              ) -> list[dict[str, Any]]:
        """Clients-table rows (one per task) for one model's ``outputs`` on one client's
        evaluation split with its ``targets``: by default top-1 accuracy and cross-entropy,
        task ``main``."""
        return [score(outputs, targets)]


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
