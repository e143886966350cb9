"""Scenarios: partition a pooled dataset into clients, each with its own distribution.

A partitioner sees only the labels and a seeded generator and returns, per client, the indices of
its samples plus its latent group; ``split_train_test`` then cuts each client's samples into its
own train and test split, so both come from the client's distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from raylf.registry import Registry


class ScenarioParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    test_fraction: float = Field(0.25, gt=0, lt=1, description="share of each client's samples")


@dataclass(frozen=True)
class Partition:
    """Per-client sample indices, latent group ids and per-client input rotation in degrees."""

    indices: list[np.ndarray]
    groups: np.ndarray
    angles: np.ndarray | None = None

    @property
    def num_clients(self) -> int:
        return len(self.indices)


SCENARIOS: Registry = Registry("scenario")


def _spread(indices: np.ndarray, owners: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle ``indices`` and cut them into ``owners`` nearly equal parts."""
    return np.array_split(rng.permutation(indices), owners)


def _iid(y: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
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


def split_train_test(
    indices: list[np.ndarray], test_fraction: float, rng: np.random.Generator
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Cut each client's samples into train and test (at least one of each)."""
    train, test = [], []
    for idx in indices:
        if len(idx) < 2:
            raise ValueError("a client needs at least two samples to have a train and a test split")
        shuffled = rng.permutation(idx)
        n_test = min(max(1, round(test_fraction * len(idx))), len(idx) - 1)
        test.append(np.sort(shuffled[:n_test]))
        train.append(np.sort(shuffled[n_test:]))
    return train, test


def make_partition(name: str, params: BaseModel, y: np.ndarray, num_clients: int,
                   rng: np.random.Generator) -> Partition:
    return SCENARIOS.get(name).partition(y, num_clients, rng, params)
