"""The contract every registered method must pass (the analogue of scikit-learn's
``check_estimator``). A method joins this suite by being registered; what it needs from the
scenario (``requires``) picks the tiny federation it runs on."""

from __future__ import annotations

import copy

import pytest
import torch

from raylf.config import validate
from raylf.data import build_federation
from raylf.experiment import run_experiment
from raylf.methods import METHODS
from raylf.methods.base import Method
from raylf.runtime import Blueprint
from raylf.runtime.local import LocalRuntime
from raylf.runtime.ray_backend import warm_actors
from raylf.runtime.shard import Reduction, upload_bytes
from raylf.training import tensor_bytes
from tests.conftest import run_local_as_a_ray_worker, small_spec_dict, without_timing

NAMES = METHODS.names()
HOOKS = [n for n, v in vars(Method).items() if callable(v) and not n.startswith("_")
         and n != "Params"]
# Loops a method runs at evaluation time whose length no contract property depends on: FedALA's
# first weight learning (up to 50 passes per never-sampled client at every evaluation) and
# FedBABU's fine-tuning, shortened so the suite spends its time on the contract, not on them.
SHORTER = {"fedala": {"start_passes": 2}, "fedbabu": {"finetune_epochs": 1}}


def one_per_implementation(names: list[str]) -> list[str]:
    """The first of the methods whose contract hooks are the same functions (those differing
    only in parameters, e.g. spcacw and its weighting rules): what a process boundary can break
    lives in the functions, so the Ray test runs each implementation once."""
    seen: dict[tuple, str] = {}
    for name in names:
        cls = METHODS.get(name)
        seen.setdefault(tuple(getattr(cls, h) for h in HOOKS), name)
    return sorted(seen.values())


def contract_spec(name: str, **changes):
    """Six clients, mlp, half participation, a validation split; the data the method needs."""
    requires = METHODS.get(name).requires
    spec = small_spec_dict(method__name=name, federation__num_clients=6,
                           federation__rounds=4, eval_every=2, model__hidden=[16],
                           scenario__val_fraction=0.1)
    if name in SHORTER:
        spec["method"]["params"] = dict(SHORTER[name])
    if "tasks" in requires:
        spec["dataset"] = {"name": "digits_multitask"}
        spec["scenario"] = {"name": "multitask_dirichlet", "alpha": 0.5, "val_fraction": 0.1}
    if "groups" in requires:
        spec["scenario"] = {"name": "rotation", "groups": 2, "val_fraction": 0.1}
    for dotted, value in changes.items():
        node = spec
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return validate(spec)


def local_runtime(spec) -> LocalRuntime:
    return LocalRuntime(Blueprint(spec, build_federation(spec)))


def personal_of(runtime: LocalRuntime) -> dict:
    return {c: s for shard in runtime.coordinator.pool.shards for c, s in shard.personal.items()}


def assert_same_tree(a, b):
    if torch.is_tensor(a):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same_tree(a[k], b[k])
    else:
        assert a == b


@pytest.mark.parametrize("name", NAMES)
def test_params_have_valid_defaults(name):
    METHODS.get(name).Params()


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_gives_identical_tables(name):
    first = run_experiment(contract_spec(name)).tables
    second = run_experiment(contract_spec(name)).tables
    assert first["trials"][0]["status"] == "ok", first["trials"][0]["error"]
    for table in ("rounds", "clients"):
        assert without_timing(first[table]) == without_timing(second[table])
    splits = {r["split"] for r in first["clients"]}
    assert splits == {"test", "val"}  # every client scored on both of its evaluation splits


@pytest.fixture(scope="module")
def warm_ray(ray_cluster):
    """Every method's Ray run after the first takes over the previous run's actors, as the
    trials of a reused Tune trial process do: equal results also show nothing leaks between
    the experiments an actor serves."""
    with warm_actors():
        yield ray_cluster


@pytest.mark.parametrize("name", one_per_implementation(NAMES))
def test_backends_give_identical_client_accuracies(warm_ray, name):
    spec = contract_spec(name, federation__rounds=2)
    local = run_local_as_a_ray_worker(spec)
    remote = run_experiment(spec, backend="ray").tables
    assert remote["trials"][0]["status"] == "ok", remote["trials"][0]["error"]

    def client_results(tables):
        return [(r["split"], r["client_id"], r["deployable"], r["task"], r["accuracy"])
                for r in tables["clients"]]

    assert client_results(remote) == client_results(local)
    assert [r["bytes_up"] for r in remote["rounds"]] == [r["bytes_up"] for r in local["rounds"]]


@pytest.mark.parametrize("name", NAMES)
def test_participants_upload_the_same_keys_and_bytes_count_what_was_sent(name, monkeypatch):
    runtime = local_runtime(contract_spec(name))
    coordinator = runtime.coordinator
    sent: list[tuple[int, dict]] = []  # every client upload handed to a worker's reduction
    add = Reduction.add
    monkeypatch.setattr(Reduction, "add",
                        lambda self, cid, upload: (sent.append((cid, upload)), add(
                            self, cid, upload))[1])
    everyone = list(range(coordinator.federation.num_clients))
    for rnd in (1, 2):
        sent.clear()
        payload = coordinator.method.broadcast(coordinator.state, rnd)
        outcome = runtime.run_round(rnd)
        participants = outcome.record["participant_ids"]
        trained = sent[: len(participants)]  # then, if the round collects, every client's report
        reports = sent[len(participants):]
        assert sorted(c for c, _ in trained) == participants
        assert reports == [] or sorted(c for c, _ in reports) == everyone
        assert len({tuple(sorted(u)) for _, u in trained}) == 1  # the same keys from everyone
        assert outcome.record["bytes_up"] == sum(upload_bytes(u) for _, u in sent)
        assert outcome.record["bytes_down"] >= tensor_bytes(payload) * len(participants)


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_and_restore_into_fresh_workers_equals_an_uninterrupted_run(name, tmp_path):
    spec = contract_spec(name)
    straight = local_runtime(spec)
    straight.setup()
    full = [straight.run_round(r) for r in (1, 2, 3, 4)]

    first = local_runtime(spec)
    first.setup()
    head = [first.run_round(r) for r in (1, 2)]
    snapshot = copy.deepcopy(first.checkpoint(str(tmp_path / "round-2")))
    fresh = local_runtime(spec)  # new workers: nothing carried over but the snapshot
    fresh.restore(snapshot)
    assert fresh.setup() is None  # the setup phase is part of what was restored
    tail = [fresh.run_round(r) for r in (3, 4)]

    resumed = head + tail
    assert without_timing([o.record for o in resumed]) == without_timing([o.record for o in full])
    assert [o.clients for o in resumed] == [o.clients for o in full]
    assert_same_tree(personal_of(fresh), personal_of(straight))
    assert_same_tree(fresh.coordinator.state, straight.coordinator.state)
