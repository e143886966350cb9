"""Scenarios: partition a pooled dataset into clients, each with its own distribution.

A partitioner sees only the labels (or, for ``natural``, the samples' owners; for ``given``, the
partition the dataset brings) and a seeded generator and returns, per client, the indices of its
samples plus its latent group;
``split_train_test`` then cuts each client's samples into its own train and test split, so both
come from the client's distribution. A scenario that needs something of the dataset declares it
in ``requires`` and ``check_compatible`` refuses a dataset that lacks it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from raylf.data.ragged import Ragged
from raylf.data.sources import SPLITS, SourceData
from raylf.errors import SpecError
from raylf.registry import Registry

log = logging.getLogger(__name__)


class ScenarioParams(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # finite numbers only
    test_fraction: float = Field(0.25, gt=0, lt=1, description="share of each client's samples")
    val_fraction: float = Field(
        0.0, ge=0, lt=1, description="share of each client's samples held out of training for "
                                     "validation (model selection, FedCE's scores); 0 = none")


@dataclass(frozen=True)
class Partition:
    """Per-client sample indices, latent group ids, per-client input rotation in degrees,
    per-client label maps (clients × classes: the label a client sees for each true label) and,
    for scenarios that must split in order, each client's test indices (``indices`` = train)
    and, where the split is given, its validation indices."""

    indices: Sequence[np.ndarray]  # a list, or a Ragged for scenarios built for many clients
    groups: np.ndarray
    angles: np.ndarray | None = None
    label_maps: np.ndarray | None = None
    test: list[np.ndarray] | None = None
    val: list[np.ndarray] | None = None

    @property
    def num_clients(self) -> int:
        return len(self.indices)


SCENARIOS: Registry = Registry("scenario")


def _spread(indices: np.ndarray, owners: int, rng: np.random.Generator) -> Ragged:
    """Shuffle ``indices`` and cut them into ``owners`` nearly equal parts (the first
    ``len % owners`` one longer, as ``np.array_split`` cuts)."""
    size, extra = divmod(len(indices), owners)
    lengths = np.full(owners, size, dtype=np.int64)
    lengths[:extra] += 1
    return Ragged.from_lengths(rng.permutation(indices), lengths)


def _iid(y: np.ndarray, num_clients: int, rng: np.random.Generator) -> Ragged:
    return _spread(np.arange(len(y)), num_clients, rng)


@SCENARIOS.register("iid")
class IID:
    """Uniformly random equal split: the no-heterogeneity reference."""

    class Params(ScenarioParams):
        pass

    @staticmethod
    def partition(y, num_clients, rng, params) -> Partition:
        return Partition(_iid(y, num_clients, rng), np.zeros(num_clients, dtype=np.int64))


@SCENARIOS.register("dirichlet")
class Dirichlet:
    """Per class, client shares drawn from Dir(alpha); small alpha = strong label skew.

    Draws are repeated until every client holds ``min_samples`` (the usual rejection loop), so
    every client has a non-empty train and test split.
    """

    class Params(ScenarioParams):
        alpha: float = Field(gt=0)
        min_samples: int = Field(4, ge=2)
        max_draws: int = Field(1000, ge=1)

    @staticmethod
    def partition(y, num_clients, rng, params) -> Partition:
        classes = np.unique(y)
        if params.min_samples * num_clients > len(y):
            raise ValueError(
                f"{len(y)} samples cannot give {num_clients} clients {params.min_samples} each"
            )
        for _ in range(params.max_draws):
            parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
            for c in classes:
                idx = rng.permutation(np.flatnonzero(y == c))
                shares = rng.dirichlet(np.full(num_clients, params.alpha))
                cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
                for k, chunk in enumerate(np.split(idx, cuts)):
                    parts[k].append(chunk)
            sizes = [sum(len(c) for c in p) for p in parts]
            if min(sizes) >= params.min_samples:
                indices = [np.sort(np.concatenate(p)) for p in parts]
                groups = np.array([np.bincount(y[i]).argmax() for i in indices], dtype=np.int64)
                return Partition(indices, groups)
        raise ValueError(
            f"dirichlet alpha={params.alpha} left a client with fewer than {params.min_samples} "
            f"samples in {params.max_draws} draws; raise alpha or lower num_clients"
        )


@SCENARIOS.register("label_subset")
class LabelSubset:
    """Pathological label skew: each client holds exactly ``k`` classes (LS2 / LS3).

    Class slots are dealt from shuffled rounds of all classes so every class is held by about
    the same number of clients; each class's samples are split evenly among its holders. The
    latent group is the client's class set.
    """

    latent_groups = True  # clients belong to known groups (oracles may use them)

    class Params(ScenarioParams):
        k: int = Field(ge=1)

    @staticmethod
    def partition(y, num_clients, rng, params) -> Partition:
        classes = np.unique(y)
        if params.k > len(classes):
            raise ValueError(f"label_subset k={params.k} exceeds the {len(classes)} classes")
        deck: list[int] = []
        holdings: list[list[int]] = []
        for _ in range(num_clients):
            chosen: list[int] = []
            while len(chosen) < params.k:
                if not deck:
                    deck = list(rng.permutation(classes))
                pick = next((c for c in deck if c not in chosen), None)
                if pick is None:
                    deck = list(rng.permutation(classes))
                    continue
                deck.remove(pick)
                chosen.append(int(pick))
            holdings.append(sorted(chosen))
        holders = {int(c): [k for k, h in enumerate(holdings) if c in h] for c in classes}
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c, owners in holders.items():
            if owners:
                for owner, chunk in zip(owners, _spread(np.flatnonzero(y == c), len(owners), rng)):
                    parts[owner].append(chunk)
        indices = [np.sort(np.concatenate(p)) for p in parts]
        sets = {tuple(h): g for g, h in enumerate(sorted({tuple(h) for h in holdings}))}
        groups = np.array([sets[tuple(h)] for h in holdings], dtype=np.int64)
        return Partition(indices, groups)


@SCENARIOS.register("rotation")
class Rotation:
    """Covariate shift: IID labels, each client's images rotated by its group's angle.

    ``groups`` rotation groups at 0, 360/G, … degrees (clients dealt round-robin), or, with
    ``step``, a continuum where client k sees k·step degrees and is its own group.
    """

    latent_groups = True  # clients belong to known groups (oracles may use them)

    class Params(ScenarioParams):
        groups: int = Field(4, ge=1)
        step: float | None = Field(None, gt=0, description="degrees between consecutive clients")

        @model_validator(mode="after")
        def _one_mode(self):
            if self.step is not None and "groups" in self.model_fields_set:
                raise ValueError("give either groups or step, not both")
            return self

    @staticmethod
    def partition(y, num_clients, rng, params) -> Partition:
        clients = np.arange(num_clients)
        if params.step is not None:
            groups, angles = clients.copy(), clients * params.step
        else:
            groups = clients % params.groups
            angles = groups * (360.0 / params.groups)
        return Partition(_iid(y, num_clients, rng), groups.astype(np.int64), angles % 360.0)


@SCENARIOS.register("label_permutation")
class LabelPermutation:
    """Concept shift: IID inputs, but each latent cluster sees the labels through its own fixed
    permutation (SP-CACW's MNIST "label switching"). Clients are dealt round-robin to clusters;
    cluster 0 keeps the true labels, the others get distinct random permutations."""

    latent_groups = True  # clients belong to known groups (oracles may use them)

    class Params(ScenarioParams):
        clusters: int = Field(3, ge=1)

    @staticmethod
    def partition(y, num_clients, rng, params) -> Partition:
        classes = int(y.max()) + 1
        perms = [np.arange(classes)]
        while len(perms) < params.clusters:
            if math.factorial(classes) < params.clusters:
                raise ValueError(f"label_permutation clusters={params.clusters} exceeds the "
                                 f"{math.factorial(classes)} permutations of {classes} labels")
            perm = rng.permutation(classes)
            if not any(np.array_equal(perm, p) for p in perms):
                perms.append(perm)
        groups = np.arange(num_clients) % params.clusters
        return Partition(_iid(y, num_clients, rng), groups.astype(np.int64),
                         label_maps=np.stack([perms[g] for g in groups]).astype(np.int64))


@SCENARIOS.register("latent_clusters")
class LatentClusters:
    """SP-CACW's CIFAR-100 construction: clients dealt round-robin to ``clusters`` clusters, the
    classes split into disjoint equal blocks, one per cluster. A client's class mass is uniform
    over its cluster's block (1/|block| each, 0 elsewhere) plus N(0, eps) noise (eps = standard
    deviation) on every class, clipped at 0: leakage into other blocks and variation inside a
    cluster. Each class's samples are then shared among clients in proportion to their mass.
    """

    latent_groups = True  # clients belong to known groups (oracles may use them)

    class Params(ScenarioParams):
        clusters: int = Field(4, ge=1)
        eps: float = Field(0.01, ge=0, description="std of the noise added to each class mass")
        min_samples: int = Field(4, ge=2)

    @staticmethod
    def partition(y, num_clients, rng, params) -> Partition:
        classes = np.unique(y)
        if params.clusters > min(num_clients, len(classes)):
            raise ValueError(f"latent_clusters clusters={params.clusters} needs at least as many "
                             f"clients ({num_clients}) and classes ({len(classes)})")
        groups = np.arange(num_clients) % params.clusters
        blocks = np.array_split(rng.permutation(len(classes)), params.clusters)
        base = np.zeros((num_clients, len(classes)))
        for k, g in enumerate(groups):
            base[k, blocks[g]] = 1.0 / len(blocks[g])
        mass = np.clip(base + rng.normal(0, params.eps, base.shape), 0, None)
        mass[mass.sum(1) == 0] = base[mass.sum(1) == 0]
        mass[:, mass.sum(0) == 0] = base[:, mass.sum(0) == 0]  # every class keeps an owner
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for j, c in enumerate(classes):
            idx = rng.permutation(np.flatnonzero(y == c))
            cuts = (np.cumsum(mass[:, j] / mass[:, j].sum())[:-1] * len(idx)).astype(int)
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
        indices = [np.sort(np.concatenate(p)) for p in parts]
        if min(map(len, indices)) < params.min_samples:
            raise ValueError(f"latent_clusters eps={params.eps} left a client with fewer than "
                             f"{params.min_samples} samples; lower num_clients")
        return Partition(indices, groups.astype(np.int64))


@SCENARIOS.register("multitask_dirichlet")
class MultitaskDirichlet:
    """FMT-SVM: Dirichlet label skew over the main (multi-class) label; every task label of a
    sample travels with it. Needs a dataset with extra task labels."""

    requires = "tasks"

    class Params(Dirichlet.Params):
        pass

    partition = staticmethod(Dirichlet.partition)


@SCENARIOS.register("natural")
class Natural:
    """Natural owners grouped into clients (SP-CACW's Shakespeare): each client holds the whole
    dialogue of ``roles_per_client`` speaking roles drawn at random among those with at least
    ``min_samples`` samples; every client is its own latent group (no cluster structure).

    Samples overlap with their neighbours (sliding windows), so a random split would put nearly
    the same window in train and test: each role is split in order instead, its last
    ``test_fraction`` is test, and ``gap`` windows between the two parts are dropped.
    """

    requires = "owners"

    class Params(ScenarioParams):
        roles_per_client: int = Field(1, ge=1, description="m: roles pooled into one client")
        min_samples: int = Field(100, ge=2, description="roles with fewer samples are not drawn")
        gap: int = Field(50, ge=0, description="windows dropped between train and test; set to "
                                               "the sequence length so they share no character")

    @staticmethod
    def partition(owners, num_clients, rng, params) -> Partition:
        ids, counts = np.unique(owners, return_counts=True)
        eligible = ids[counts >= params.min_samples + params.gap]
        wanted = num_clients * params.roles_per_client
        if wanted > len(eligible):
            raise ValueError(f"natural: {num_clients} clients × {params.roles_per_client} roles "
                             f"need {wanted} roles with ≥ {params.min_samples} samples; the "
                             f"dataset has {len(eligible)}")
        chosen = rng.choice(eligible, wanted, replace=False).reshape(num_clients, -1)
        train, test = [], []
        for roles in chosen:
            parts = [np.flatnonzero(owners == r) for r in roles]
            n_test = [max(1, round(params.test_fraction * (len(p) - params.gap))) for p in parts]
            train.append(np.concatenate([p[: len(p) - t - params.gap]
                                         for p, t in zip(parts, n_test)]))
            test.append(np.concatenate([p[len(p) - t:] for p, t in zip(parts, n_test)]))
        return Partition(train, np.arange(num_clients, dtype=np.int64), test=test)


@SCENARIOS.register("given")
class Given:
    """Bring your own partition: every sample goes to the client the dataset's ``client`` array
    names (ids 0..N−1, N = federation.num_clients), so a LEAF, Flower-datasets or PFLlib split
    runs on exactly its clients. With a ``split`` array every sample keeps its train / val /
    test split (``test_fraction`` and ``val_fraction`` then do not apply) and every client
    needs training and test samples; without one each client's samples are split like any
    scenario's. Every client is its own group."""

    requires = "client"

    class Params(ScenarioParams):
        pass

    @staticmethod
    def partition(source, num_clients, rng, params) -> Partition:
        client, split = source.client_of, source.split_of
        _check_given_clients(client, num_clients)
        width = 1 if split is None else len(SPLITS)
        key = client * width + (0 if split is None else split)
        counts = np.bincount(key, minlength=num_clients * width).reshape(num_clients, width)
        parts = np.split(np.argsort(key, kind="stable"), np.cumsum(counts.ravel())[:-1])
        groups = np.arange(num_clients, dtype=np.int64)
        if split is None:
            _refuse_clients(counts[:, 0] < 2, "hold fewer than 2 samples, too few for a train "
                                              "and a test split; give them more samples or "
                                              "add a split array")
            return Partition(parts, groups)
        fixed = sorted({"test_fraction", "val_fraction"} & params.model_fields_set)
        if fixed:
            raise SpecError([(f"scenario.{fixed[0]}", (
                "the dataset's split array fixes every sample's split; remove "
                f"scenario.{fixed[0]} (or the split array)"))])
        train, val, test = (parts[SPLITS.index(name)::width] for name in ("train", "val", "test"))
        for name, column in (("training", "train"), ("test", "test")):
            _refuse_clients(counts[:, SPLITS.index(column)] == 0,
                            f"have no {name} samples (split '{column}'); give every client "
                            f"{name} samples, or drop those clients and renumber the rest")
        return Partition(list(train), groups, test=list(test), val=list(val))


def _check_given_clients(client: np.ndarray, num_clients: int) -> None:
    """The client array's ids must be exactly 0..num_clients−1."""
    present = np.unique(client)
    renumber = "renumber them 0..N-1 (np.unique(client, return_inverse=True)[1])"
    if len(present) and present[-1] == len(present) - 1 != num_clients - 1:
        raise SpecError([("federation.num_clients", (
            f"the dataset's client array holds {len(present)} clients (ids 0..{present[-1]}) "
            f"but federation.num_clients is {num_clients}; set "
            f"federation.num_clients={len(present)}"))])
    if len(present) != num_clients or present[-1] != num_clients - 1:
        missing = np.setdiff1d(np.arange(num_clients), present)[:5].tolist()
        beyond = present[present >= num_clients][:5].tolist()
        raise SpecError([("dataset.path", (
            f"the client array's ids must be 0..{num_clients - 1} (federation.num_clients="
            f"{num_clients}); " + (f"ids without samples: {missing}; " if missing else "") +
            (f"ids beyond: {beyond}; " if beyond else "") + renumber +
            f" and set federation.num_clients to their count ({len(present)})"))])


def _refuse_clients(bad: np.ndarray, problem: str) -> None:
    if bad.any():
        ids = np.flatnonzero(bad)
        listed = ", ".join(map(str, ids[:5])) + (" …" if len(ids) > 5 else "")
        raise SpecError([("dataset.path", f"client(s) {listed} of the client array {problem}")])


def split_validation(
    train: Sequence[np.ndarray], totals: np.ndarray, val_fraction: float, rng: np.random.Generator
) -> tuple[Ragged, Ragged]:
    """Hold ``val_fraction`` of each client's samples (of ``totals``) out of its training split,
    keeping at least one training sample; 0 leaves the training split untouched. All clients
    at once (one seeded shuffle of every client's list), so a million clients cost a sort."""
    train = Ragged.from_parts(train)
    if not val_fraction:
        return train, Ragged.empty(len(train))
    n_val = np.clip(np.round(val_fraction * np.asarray(totals)), 0,
                    np.maximum(train.lengths - 1, 0)).astype(np.int64)
    val, kept = train.shuffled(rng).cut(n_val)
    return kept.sorted(), val.sorted()


def split_train_test(
    indices: Sequence[np.ndarray], test_fraction: float, rng: np.random.Generator
) -> tuple[Ragged, Ragged]:
    """Cut each client's samples into train and test (at least one of each), all clients at
    once like ``split_validation``."""
    indices = Ragged.from_parts(indices)
    sizes = indices.lengths
    if len(sizes) and sizes.min() < 2:
        raise ValueError("a client needs at least two samples to have a train and a test split")
    n_test = np.clip(np.round(test_fraction * sizes), 1, sizes - 1).astype(np.int64)
    test, train = indices.shuffled(rng).cut(n_test)
    return train.sorted(), test.sorted()


class Incompatible(ValueError):
    """The scenario needs something the dataset does not have (task labels, natural owners)."""


_NEEDS = {
    "tasks": ("extra task labels", lambda src: bool(src.tasks),
              "multi-task datasets: digits_multitask, digits28_multitask, pneumonia, "
              "breast_ultrasound, or npz with y_<task> arrays"),
    "owners": ("natural owners of its samples", lambda src: src.owners is not None,
               "datasets with owners: shakespeare"),
    "client": ("a partition of its own (a client array)", lambda src: src.client_of is not None,
               "add a client array to the npz: the owning client id 0..N-1 of each sample, "
               "optionally a split array of train / val / test"),
}


def check_compatible(scenario: str, dataset: str, source: SourceData) -> None:
    need = getattr(SCENARIOS.get(scenario), "requires", None)
    if need is not None:
        what, present, hint = _NEEDS[need]
        if not present(source):
            raise Incompatible(f"scenario {scenario!r} needs a dataset with {what}; dataset "
                               f"{dataset!r} has none ({hint})")


def make_partition(name: str, params: BaseModel, source: SourceData, num_clients: int,
                   rng: np.random.Generator) -> Partition:
    scenario = SCENARIOS.get(name)
    need = getattr(scenario, "requires", None)
    if source.client_of is not None and need != "client":
        log.warning("the dataset brings its own partition (a client array); scenario %r "
                    "partitions the pooled samples instead (scenario given uses it)", name)
    by = source if need == "client" else source.owners if need == "owners" else source.y
    return scenario.partition(by, num_clients, rng, params)
