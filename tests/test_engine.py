"""The engine on the in-process backend: tables, metrics, divergence, method halves, models."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raylf import results
from raylf.config import SpecError, validate
from raylf.data import build_federation
from raylf.experiment import run_experiment
from raylf.methods.base import Uploads
from raylf.metrics import accuracy_summary
from raylf.models import build_model
from raylf.run import main as run_main
from raylf.runtime import Blueprint
from raylf.runtime.coordinator import balance
from raylf.runtime.local import LocalRuntime
from raylf.runtime.shard import ClientShard
from raylf.testing import client_round
from raylf.tree import tensor_bytes
from tests.conftest import small_spec_dict
from tests.test_config import EXAMPLE


def test_local_run_writes_three_tables_with_exact_rows(small_spec, tmp_path):
    spec = small_spec(federation__rounds=5)
    result = run_experiment(spec, backend="local", out=str(tmp_path))
    tables = results.load(tmp_path)
    assert result.status == "ok"
    assert len(tables["trials"]) == 1
    assert list(tables["rounds"]["round"]) == [1, 2, 3, 4, 5]
    eval_rounds = [2, 4, 5]  # every 2 rounds, and always after the last
    assert len(tables["clients"]) == 8 * len(eval_rounds)
    assert sorted(tables["clients"]["round"].unique()) == eval_rounds
    rounds = tables["rounds"].set_index("round")
    assert rounds.loc[[1, 3], "acc_mean"].isna().all()
    assert rounds.loc[eval_rounds, "acc_mean"].notna().all()
    trial = tables["trials"].iloc[0]
    assert trial["acc_mean"] == pytest.approx(rounds.loc[5, "acc_mean"])
    assert trial["federation.optimizer.lr"] == 0.05 and trial["scenario.k"] == 2
    meta = results.read_table(tmp_path, "trials").schema.metadata
    assert {b"raylf", b"ray", b"torch", b"git_sha", b"config"} <= set(meta)


def test_summary_metrics_follow_the_papers():
    acc = np.array([0.5, 1.0, 0.25, 0.75, 1.0, 0.0, 1.0, 1.0, 0.5, 0.5])
    n = np.array([2, 1, 4, 4, 3, 2, 1, 1, 2, 2])
    s = accuracy_summary(acc, acc * n, n)
    assert s["acc_mean"] == pytest.approx(acc.mean())
    assert s["acc_weighted"] == pytest.approx((acc * n).sum() / n.sum())
    assert s["acc_worst"] == 0.0 and s["acc_gap"] == 1.0
    assert s["acc_bottom20"] == pytest.approx((0.0 + 0.25) / 2)  # ceil(0.2·10) = 2 clients


def test_fedavg_se_beats_fedavg_on_label_skew():
    from raylf.config import load_spec

    acc = {}
    for method in ("fedavg_se", "fedavg"):
        spec = load_spec(EXAMPLE, [f"method.name={method}"])
        acc[method] = run_experiment(spec, backend="local").trial["acc_mean"]
    assert acc["fedavg_se"] > acc["fedavg"] + 0.03, acc


def test_divergence_is_recorded_with_round_and_tables(tmp_path, capsys):
    code = run_main([str(EXAMPLE), "--backend", "local", "--out", str(tmp_path),
                     "--set", "federation.optimizer.lr=1e6"])
    out = capsys.readouterr()
    assert code == 3
    trial = results.load(tmp_path)["trials"].iloc[0]
    assert trial["status"] == "diverged"
    assert trial["diverged_round"] >= 1 and trial["rounds"] == trial["diverged_round"]
    assert f"round {int(trial['diverged_round'])}" in trial["error"]
    assert "diverged" in out.out


def test_same_seed_same_everything_different_seed_differs(small_spec):
    a = run_experiment(small_spec(), backend="local").tables
    b = run_experiment(small_spec(), backend="local").tables
    c = run_experiment(small_spec(seed=4), backend="local").tables
    acc = [[r["accuracy"] for r in t["clients"]] for t in (a, b, c)]
    ids = [[r["participant_ids"] for r in t["rounds"]] for t in (a, b, c)]
    assert acc[0] == acc[1] and ids[0] == ids[1]
    assert ids[0] != ids[2]


def test_participation_draws_the_configured_fraction(small_spec):
    spec = small_spec(federation__num_clients=40, federation__participation=0.25)
    rounds = run_experiment(spec, backend="local").tables["rounds"]
    assert all(r["participants"] == 10 == len(set(r["participant_ids"])) for r in rounds)


# ---- method halves, without any runtime ---------------------------------------------------

def _blueprint(method: str, **changes) -> Blueprint:
    spec = validate(small_spec_dict(method__name=method, **changes))
    return Blueprint(spec, build_federation(spec))


def test_fedavg_aggregate_is_sample_weighted():
    method = _blueprint("fedavg").method()
    stacked = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    state, _ = method.aggregate({}, Uploads(np.array([0, 1]), torch.tensor([3.0, 1.0]),
                                            {"model": stacked}), 1)
    assert torch.allclose(state["model"], torch.tensor([0.75, 0.25]))


def test_fedprox_with_mu_zero_equals_fedavg_and_mu_pulls_towards_anchor():
    bp = _blueprint("fedavg")
    init = bp.initial_vector()
    data = bp.federation.shard(np.array([0]), torch.device("cpu")).client(0)

    def update(method_name, mu):
        b = _blueprint(method_name, method__params={"mu": mu} if mu is not None else {})
        up = b.method().local_update(client_round(b.trainer(torch.device("cpu")), data,
                                                  seed=7, payload={"model": init}))
        return up.upload["model"]

    plain = update("fedavg", None)
    assert torch.equal(update("fedprox", 0.0), plain)
    strong = update("fedprox", 10.0)
    assert (strong - init).norm() < (plain - init).norm()


def test_fedavg_se_uploads_only_the_encoder_and_keeps_its_head():
    bp = _blueprint("fedavg_se")
    layout, method = bp.layout, bp.method()
    init = bp.initial_vector()
    head = method.client_init(0, init)
    assert head.numel() == layout.part_size("head")
    data = bp.federation.shard(np.array([0]), torch.device("cpu")).client(0)
    payload = method.broadcast(method.server_init(init), 1)
    up = method.local_update(client_round(bp.trainer(torch.device("cpu")), data, seed=1,
                                          payload=payload, personal=head))
    assert set(up.upload) == {"encoder"}
    assert up.upload["encoder"].numel() == layout.part_size("encoder")
    assert tensor_bytes(up.upload) == layout.part_size("encoder") * 4
    assert not torch.equal(up.personal, head)  # the private head trained locally


def test_local_uploads_nothing_and_trains_its_own_model():
    rounds = run_experiment(validate(small_spec_dict(method__name="local")),
                            backend="local").tables["rounds"]
    assert all(r["bytes_up"] == 0 and r["bytes_down"] == 0 for r in rounds)


def test_freezing_by_optimizer_groups_keeps_the_frozen_part_exact():
    bp = _blueprint("fedavg", federation__optimizer={"lr": 0.1, "momentum": 0.9,
                                                     "weight_decay": 0.01})
    trainer = bp.trainer(torch.device("cpu"))
    data = bp.federation.shard(np.array([0]), torch.device("cpu")).client(0)
    before = trainer.vector()
    trainer.fit(data.x_train, data.y_train, seed=1, trainable=("encoder",), epochs=3)
    after = trainer.vector()
    head = bp.layout.part("head")
    assert torch.equal(after[head], before[head])
    assert not torch.equal(after[bp.layout.part("encoder")], before[bp.layout.part("encoder")])


def test_stateless_methods_hold_no_model_copy_per_client():
    spec = validate(small_spec_dict(
        method__name="fedavg", dataset={"name": "synthetic", "n_samples": 4000},
        scenario={"name": "iid"}, federation__num_clients=1000))
    shard = ClientShard(Blueprint(spec, build_federation(spec)), np.arange(500))
    assert shard.personal == {}
    stateful = validate(small_spec_dict(
        dataset={"name": "synthetic", "n_samples": 4000}, scenario={"name": "iid"},
        federation__num_clients=1000))
    bp = Blueprint(stateful, build_federation(stateful))
    heads = ClientShard(bp, np.arange(500)).personal
    assert len(heads) == 500 and all(h.numel() == bp.layout.part_size("head")
                                     for h in heads.values())


def test_workers_return_one_weighted_sum_per_averaged_key_not_one_upload_per_client():
    bp = _blueprint("fedavg", resources__cohort="off")  # the reference trains one at a time
    init = bp.initial_vector()
    ids = np.array([0, 2, 3])
    result = ClientShard(bp, np.arange(4)).train(1, {"model": init}, ids, {})
    assert result["uploads"] == {} and list(result["sums"]["model"]) == [0]
    assert result["sums"]["model"][0].shape == init.shape
    assert result["weights"]["model"][0] == float(bp.federation.n_train[ids].sum())
    assert list(result["bytes_up"]) == [tensor_bytes(init)] * 3  # still counted per client
    reference = ClientShard(bp, np.arange(4))  # the same local updates, one client at a time
    n = bp.federation.n_train
    per_client = [reference.train(1, {"model": init}, ids[k:k + 1], {})["sums"]["model"][0] / n[c]
                  for k, c in enumerate(ids)]
    expected = sum(float(n[c]) * v for c, v in zip(ids, per_client))
    assert torch.allclose(result["sums"]["model"][0], expected, rtol=1e-9)


def test_balance_gives_every_participant_once_and_evens_the_load():
    ids = np.array([3, 5, 8, 11, 12, 17])
    sizes = np.array([90, 10, 40, 40, 30, 50])
    work = balance(ids, sizes, 2)
    assert sorted(np.concatenate(list(work.values()))) == sorted(ids)
    assert all(list(part) == sorted(part) for part in work.values())
    loads = [sizes[np.isin(ids, part)].sum() for part in work.values()]
    assert max(loads) - min(loads) <= 10  # 130 / 130 here
    assert {k: list(v) for k, v in balance(ids, sizes, 2).items()} == \
           {k: list(v) for k, v in work.items()}


def test_balance_improves_on_largest_first_where_that_leaves_the_load_uneven():
    ids = np.arange(5)
    sizes = np.array([3, 3, 2, 2, 2])  # largest first: {3, 2, 2} = 7 against {3, 2} = 5
    loads = sorted(int(sizes[part].sum()) for part in balance(ids, sizes, 2).values())
    assert loads == [6, 6]
    sizes = np.array([8, 7, 6, 5, 4])  # largest first: {8, 5, 4} = 17 against {7, 6} = 13
    loads = sorted(int(sizes[part].sum()) for part in balance(ids, sizes, 2).values())
    assert loads == [15, 15]
    loads = sorted(int(sizes[part].sum()) for part in balance(ids, sizes, 3).values())
    assert loads[-1] == 11  # {8}, {7, 4}, {6, 5}


def test_replicated_data_balances_work_and_matches_sharded_aggregates():
    def runtime(client_data):
        spec = validate(small_spec_dict(method__name="fedavg", federation__participation=1.0,
                                        resources__client_data=client_data))
        return LocalRuntime(Blueprint(spec, build_federation(spec)))

    sharded, replicated = runtime("sharded"), runtime("replicated")
    assert replicated.coordinator.balanced and not sharded.coordinator.balanced
    assert all(len(s.data.client_ids) == 8 for s in replicated.coordinator.pool.shards)
    rows = []
    for rt in (sharded, replicated):
        for rnd in (1, 2):
            outcome = rt.run_round(rnd)
        rows.append(outcome.clients)
    assert torch.equal(sharded.coordinator.state["model"], replicated.coordinator.state["model"])
    assert [r["client_id"] for r in rows[1]] == list(range(8))  # each client evaluated once
    assert [r["n_test"] for r in rows[1]] == [r["n_test"] for r in rows[0]]


def test_replicated_client_data_is_refused_for_methods_with_client_state():
    with pytest.raises(SpecError, match="resources.client_data"):
        validate(small_spec_dict(method__name="fedavg_se", resources__client_data="replicated"))
    auto = validate(small_spec_dict(method__name="fedavg_se"))
    assert not Blueprint(auto, build_federation(auto)).replicated


# ---- models -------------------------------------------------------------------------------

@pytest.mark.parametrize("name, params", [("mlp", {"hidden": [16]}), ("cnn", {"features": 24}),
                                          ("resnet18", {}), ("mobilenet_v2", {})])
def test_models_split_into_encoder_and_head_on_32px(name, params):
    from raylf.models import MODELS

    model = build_model(name, MODELS.get(name).Params(**params), (3, 32, 32), 10)
    x = torch.randn(2, 3, 32, 32)
    model.eval()
    features = model.encoder(x)
    assert model.head(features).shape == (2, 10)
    assert isinstance(model.head, torch.nn.Linear)


@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 64, 64)])
def test_cnn_flatten_size_is_derived_from_the_input(shape):
    from raylf.models import CNN

    model = build_model("cnn", CNN.Params(), shape, 3)
    assert model(torch.randn(4, *shape)).shape == (4, 3)
    assert math.prod(shape) > 0
