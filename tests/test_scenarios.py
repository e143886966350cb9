"""Partitioners: properties every scenario must keep, and the paper-specific constructions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raylf.config import SpecError, validate
from raylf.data import build_federation, presets
from raylf.data.scenarios import SCENARIOS, make_partition, split_train_test
from raylf.data.sources import SourceData
from raylf.seeding import stream

SCENARIO_PARAMS = {
    "iid": {},
    "dirichlet": {"alpha": 0.5, "min_samples": 2},
    "multitask_dirichlet": {"alpha": 0.5, "min_samples": 2},
    "label_subset": {"k": 2},
    "rotation": {"groups": 3},
    "label_permutation": {"clusters": 3},
    "latent_clusters": {"clusters": 2, "eps": 0.01, "min_samples": 2},
}


def _source(y: np.ndarray) -> SourceData:
    classes = int(y.max()) + 1
    return SourceData(np.zeros((len(y), 1), np.float32), y, classes, [str(c) for c in
                      range(classes)], {"binary": y % 2})


def _partition(name: str, y: np.ndarray, clients: int, seed: int, **extra):
    params = SCENARIOS.get(name).Params(**{**SCENARIO_PARAMS[name], **extra})
    return make_partition(name, params, _source(y), clients, stream(seed, "partition"))


labels = st.integers(4, 8).flatmap(
    lambda c: st.lists(st.integers(0, c - 1), min_size=200, max_size=400)
    .map(lambda ys: np.array(ys + list(range(c)) * 30, dtype=np.int64)))


@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(sorted(SCENARIO_PARAMS)), y=labels, clients=st.integers(2, 6),
       seed=st.integers(0, 2**31))
def test_partitions_are_disjoint_grouped_and_seeded(name, y, clients, seed) -> None:
    part = _partition(name, y, clients, seed)
    assert part.num_clients == clients and part.groups.shape == (clients,)
    everything = np.concatenate(part.indices)
    assert len(everything) == len(np.unique(everything))  # no sample in two clients
    train, test = split_train_test(part.indices, 0.25, stream(seed, "split"))
    for tr, te in zip(train, test):
        assert len(tr) and len(te) and not np.intersect1d(tr, te).size
    again = _partition(name, y, clients, seed)
    assert all(np.array_equal(a, b) for a, b in zip(part.indices, again.indices))
    assert np.array_equal(part.groups, again.groups)


@pytest.mark.parametrize("name", sorted(SCENARIO_PARAMS))
def test_different_seeds_give_different_partitions(name: str) -> None:
    y = np.arange(600) % 6
    a, b = (_partition(name, y, 4, s) for s in (1, 2))
    assert any(not np.array_equal(i, j) for i, j in zip(a.indices, b.indices))


@settings(max_examples=20, deadline=None)
@given(y=labels, clients=st.integers(2, 8), k=st.integers(1, 4), seed=st.integers(0, 2**31))
def test_label_subset_gives_exactly_k_classes(y, clients, k, seed) -> None:
    part = _partition("label_subset", y, clients, seed, k=k)
    for idx in part.indices:
        assert len(np.unique(y[idx])) == k


def test_larger_dirichlet_alpha_moves_towards_iid() -> None:
    y = np.arange(3000) % 10
    share = np.bincount(y) / len(y)

    def distance(alpha: float) -> float:
        tv = [0.5 * np.abs(np.bincount(y[i], minlength=10) / len(i) - share).sum()
              for seed in range(3) for i in _partition("dirichlet", y, 10, seed,
                                                       alpha=alpha).indices]
        return float(np.mean(tv))

    d = [distance(a) for a in (0.07, 0.3, 1.0, 10.0, 100.0)]
    assert all(x > y for x, y in zip(d, d[1:])), d
    assert d[-1] < 0.1 < 0.5 < d[0]


def test_rotation_step_is_a_continuum() -> None:
    part = make_partition("rotation", SCENARIOS.get("rotation").Params(step=4.0),
                          _source(np.arange(900) % 10), 89, stream(0, "partition"))
    assert part.angles[1] == 4.0 and part.angles[88] == 352.0
    assert len(set(part.groups)) == 89


def test_label_permutation_per_cluster_and_applied_in_the_shard() -> None:
    part = _partition("label_permutation", np.arange(700) % 10, 7, 0)
    maps = part.label_maps
    assert list(part.groups) == [0, 1, 2, 0, 1, 2, 0]
    assert np.array_equal(maps[0], np.arange(10))  # cluster 0 sees the true labels
    for k in range(7):
        assert sorted(maps[k]) == list(range(10))
        assert np.array_equal(maps[k], maps[k % 3])
    assert len({tuple(m) for m in maps}) == 3
    spec = validate({"dataset": {"name": "digits"}, "scenario": {"name": "label_permutation"},
                     "model": {"name": "mlp"}, "method": {"name": "fedavg"},
                     "federation": {"num_clients": 6, "rounds": 1}})
    fed = build_federation(spec)
    from raylf.data.sources import load_source

    true_y = load_source("digits", spec.dataset_params).y
    shard = fed.shard(np.array([1, 4]), torch.device("cpu"))
    expect = np.concatenate([fed.label_maps[c][true_y[fed.train[c]]] for c in (1, 4)])
    assert np.array_equal(shard.train.y.numpy(), expect)
    assert not np.array_equal(expect, true_y[np.concatenate([fed.train[1], fed.train[4]])])


@pytest.mark.parametrize("eps, own_share", [(0.001, 0.9), (10.0, 0.0)])
def test_latent_clusters_own_disjoint_classes_with_leakage(eps: float, own_share: float) -> None:
    y = np.arange(60000) % 100
    part = _partition("latent_clusters", y, 20, 0, clusters=4, eps=eps)
    assert list(np.bincount(part.groups)) == [5, 5, 5, 5]
    owned = [set(np.flatnonzero(np.bincount(np.concatenate(
        [y[part.indices[k]] for k in range(20) if part.groups[k] == g]), minlength=100) > 0))
        for g in range(4)]
    if eps < 0.01:  # almost no leakage: each cluster holds its own 25 classes
        main = [np.bincount(np.concatenate([y[part.indices[k]] for k in range(20)
                                            if part.groups[k] == g]), minlength=100)
                for g in range(4)]
        blocks = [set(np.argsort(m)[-25:]) for m in main]
        assert all(len(b & c) == 0 for i, b in enumerate(blocks) for c in blocks[i + 1:])
        for k in range(20):
            ys = y[part.indices[k]]
            assert np.isin(ys, list(blocks[part.groups[k]])).mean() >= own_share
    else:  # large noise leaks every cluster into (nearly) every class
        assert all(len(o) > 90 for o in owned)


def _spec(dataset: str, scenario: dict) -> dict:
    return {"dataset": {"name": dataset}, "scenario": scenario, "model": {"name": "mlp"},
            "method": {"name": "fedavg"}, "federation": {"num_clients": 5, "rounds": 1}}


@pytest.mark.parametrize("scenario, needs", [
    ({"name": "multitask_dirichlet", "alpha": 0.5}, "extra task labels"),
    ({"name": "natural"}, "natural owners"),
])
def test_incompatible_pair_names_the_field(scenario: dict, needs: str) -> None:
    spec = validate(_spec("digits", scenario))
    with pytest.raises(SpecError, match=rf"scenario\.name: .*needs a dataset with {needs}"):
        build_federation(spec)


def test_multitask_dirichlet_keeps_every_task() -> None:
    fed = build_federation(validate(_spec("digits_multitask",
                                          {"name": "multitask_dirichlet", "alpha": 0.3})))
    shard = fed.shard(np.arange(5), torch.device("cpu"))
    assert set(shard.train.tasks) == {"binary", "multiclass"}
    assert torch.equal(shard.train.tasks["multiclass"], shard.train.y)


def test_scenario_params_errors_name_the_field() -> None:
    with pytest.raises(SpecError, match=r"scenario\.eps: .*greater than or equal to 0"):
        validate(_spec("digits", {"name": "latent_clusters", "eps": -1}))
    with pytest.raises(SpecError, match=r"scenario\.clusters"):
        validate(_spec("digits", {"name": "label_permutation", "clusters": 0}))


@pytest.mark.parametrize("name", presets.names())
def test_every_preset_is_a_valid_spec(name: str) -> None:
    spec = validate({"preset": name, "model": presets.PRESETS[name].get("model", {"name": "mlp"}),
                     "method": {"name": "fedavg"}, "federation": {"rounds": 1}})
    assert spec.dataset.name == presets.PRESETS[name]["dataset"]["name"]
    assert spec.federation.num_clients == presets.PRESETS[name]["federation"]["num_clients"]
    assert presets.PRESETS[name]["note"]


def test_preset_merges_under_the_spec_and_unknown_is_refused() -> None:
    spec = validate({"preset": "hdcfl-c10-rot", "method": {"name": "fedavg"},
                     "federation": {"rounds": 3, "num_clients": 8},
                     "scenario": {"name": "dirichlet", "alpha": 0.1}})
    assert spec.dataset.name == "cifar10" and spec.model.name == "resnet18"
    assert spec.federation.num_clients == 8 and spec.scenario_params.alpha == 0.1
    same = validate({"preset": "hdcfl-c10-rot", "method": {"name": "fedavg"},
                     "federation": {"rounds": 3}, "scenario": {"groups": 2}})
    assert same.scenario.name == "rotation" and same.scenario_params.groups == 2
    with pytest.raises(SpecError, match=r"preset: unknown preset 'c10'; allowed: .*hdcfl-c10-ls2"):
        validate({"preset": "c10", "method": {"name": "fedavg"}})
