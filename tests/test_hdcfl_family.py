"""HDC-FL and the baselines that are not clustered methods of their own: FedBABU and the
clustered oracles; the donor-swap diagnostic on a tiny checkpointed run."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch

from raylf import diagnostics
from raylf.config import validate
from raylf.data import build_federation
from raylf.errors import SpecError
from raylf.experiment import run_experiment
from raylf.methods.hdcfl import head_descriptors, memberships, top_scores
from raylf.runtime import Blueprint
from raylf.runtime.local import LocalRuntime
from tests.conftest import small_spec_dict

ROTATION = {"name": "rotation", "groups": 2}


def spec_of(method: str, params: dict | None = None, **changes):
    return validate(small_spec_dict(method__name=method, method__params=params or {},
                                    scenario=ROTATION, federation__num_clients=6,
                                    model__hidden=[16], **changes))


def runtime_of(spec) -> LocalRuntime:
    return LocalRuntime(Blueprint(spec, build_federation(spec)))


def test_memberships_are_distributions_over_groups():
    rng = np.random.default_rng(0)
    z = head_descriptors(torch.from_numpy(rng.normal(size=(7, 30))).float(), rank=3)
    assert z.shape == (7, 3)
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0)
    centers, labels = z[:2], np.array([0, 1, 0, 1, 1, 0, 0])
    soft = memberships(z, centers, labels, temperature=0.1, soft=True)
    np.testing.assert_allclose(soft.sum(1), 1.0)
    assert (soft >= 0).all()
    assert soft[0, 0] > 0.5 and soft[1, 1] > 0.5  # each center's own point leans to it
    hard = memberships(z, centers, labels, temperature=0.1, soft=False)
    np.testing.assert_array_equal(hard, np.eye(2)[labels])


@pytest.mark.parametrize("shape", [(7, 30), (30, 7)])
def test_gram_scores_equal_the_truncated_svd_up_to_sign(shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    u, s, _ = torch.linalg.svd(x, full_matrices=False)
    torch.testing.assert_close(top_scores(x, 3).abs(), (u[:, :3] * s[:3]).abs())


def test_hdcfl_leaves_the_fedavg_se_encoder_trajectory_bit_for_bit_unchanged():
    params = {"groups": 2, "activation": 1, "refresh_every": 1}  # a refresh every round
    personalized = runtime_of(spec_of("hdcfl", params))
    baseline = runtime_of(spec_of("fedavg_se"))
    for rnd in (1, 2, 3, 4):
        outcome = personalized.run_round(rnd)
        baseline.run_round(rnd)
        assert torch.equal(personalized.coordinator.state["encoder"],
                           baseline.coordinator.state["encoder"])
        assert {"silhouette", "ari_latent", "membership_entropy", "groups_used"} \
            <= outcome.record.keys()
    assert len(personalized.coordinator.state["prototypes"]) == 2
    mixed = [r for r in outcome.clients if r["deployable"] == "mixture" and r["mixture"]]
    assert mixed
    assert outcome.record["groups_used"] == len({row["cluster"] for row in mixed})
    for row in mixed:
        weights = json.loads(row["mixture"])
        assert sum(weights) == pytest.approx(1.0, abs=1e-5)
        assert row["cluster"] == int(np.argmax(weights))
    gain = outcome.record["acc_mean"] - outcome.record["acc_mean_shared"]
    assert outcome.record["acc_gain_mean"] == pytest.approx(gain)


def test_groups_zero_is_fedavg_se_exactly():
    plain = run_experiment(spec_of("fedavg_se")).tables
    ablated = run_experiment(spec_of("hdcfl", {"groups": 0})).tables
    keys = ("acc_mean", "acc_worst", "acc_bottom20", "loss", "bytes_up", "bytes_down")
    for a, b in zip(plain["rounds"], ablated["rounds"], strict=True):
        assert [a.get(k) for k in keys] == [b.get(k) for k in keys]
    mixture = [(r["client_id"], r["split"], r["accuracy"]) for r in ablated["clients"]
               if r["deployable"] == "mixture"]
    assert mixture == [(r["client_id"], r["split"], r["accuracy"]) for r in plain["clients"]]


def test_fedbabu_head_never_changes_during_federated_training():
    spec = spec_of("fedbabu", {"finetune_epochs": 2},
                   federation__optimizer={"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01})
    runtime = runtime_of(spec)
    coordinator = runtime.coordinator
    head0 = coordinator.state["head"].clone()
    encoder0 = coordinator.state["encoder"].clone()
    head = coordinator.method.ctx.layout.part("head")
    trained_heads = []
    for shard in coordinator.pool.shards:
        def spy(*args, _real=shard.method.plan, **kwargs):  # sees every trained vector
            plan = _real(*args, **kwargs)

            def finish(trained, _inner=plan.finish):
                trained_heads.append(trained[head].clone())
                return _inner(trained)

            return dataclasses.replace(plan, finish=finish)

        shard.method.plan = spy
    outcomes = [runtime.run_round(rnd) for rnd in (1, 2)]
    assert trained_heads and all(torch.equal(h, head0) for h in trained_heads)
    assert torch.equal(coordinator.state["head"], head0)
    assert not torch.equal(coordinator.state["encoder"], encoder0)
    rows = pd.DataFrame(outcomes[-1].clients)
    assert set(rows["deployable"]) == {"finetuned", "global"}
    tuned = rows[rows.deployable == "finetuned"].set_index(["client_id", "split"])["loss"]
    plain = rows[rows.deployable == "global"].set_index(["client_id", "split"])["loss"]
    assert (tuned != plain).all()  # every client was fine-tuned before its finetuned row


@pytest.mark.parametrize("name", ["clustered_oracle", "clustered_oracle_se"])
def test_oracles_refuse_a_scenario_without_groups(name):
    raw = small_spec_dict(method__name=name, scenario={"name": "dirichlet", "alpha": 0.5})
    with pytest.raises(SpecError, match="latent group labels"):
        validate(raw)


def test_clustered_oracle_is_fedavg_inside_each_true_group():
    """One whole model per group, started from the common init; after a round each group's
    model is the n_k-weighted mean of its own participants' trained models, and every client
    is scored with its group's model."""
    runtime = runtime_of(spec_of("clustered_oracle", federation__participation=1.0))
    coordinator = runtime.coordinator
    init = coordinator.state["models"].clone()
    trained = {}  # client → (trained vector, n_k, the model it started from)
    for shard in coordinator.pool.shards:
        def spy(client, _real=shard.method.plan):
            plan = _real(client)

            def finish(vector, _inner=plan.finish, _cid=client.cid, _n=client.data.n_train,
                       _start=plan.start):
                trained[_cid] = (vector.clone(), _n, _start.clone())
                return _inner(vector)

            return dataclasses.replace(plan, finish=finish)

        shard.method.plan = spy
    outcome = runtime.run_round(1)
    groups = coordinator.method.ctx.latent_groups  # rotation: 0 and 1
    models = coordinator.state["models"]
    assert len(models) == 2 and torch.equal(init[0], init[1])
    for g in (0, 1):
        members = [c for c in trained if groups[c] == g]
        assert members and all(torch.equal(trained[c][2], init[g]) for c in members)
        n = torch.tensor([float(trained[c][1]) for c in members])
        mean = (n[:, None] * torch.stack([trained[c][0] for c in members])).sum(0) / n.sum()
        torch.testing.assert_close(models[g], mean)
    assert not torch.equal(models[0], models[1])
    assert all(row["cluster"] == groups[row["client_id"]] for row in outcome.clients)


def test_clustered_oracle_se_trains_one_encoder_per_group():
    runtime = runtime_of(spec_of("clustered_oracle_se"))
    init = runtime.coordinator.state["encoders"].clone()
    runtime.run_round(1)
    encoders = runtime.coordinator.state["encoders"]
    assert len(encoders) == 2 and not torch.equal(encoders[0], encoders[1])
    assert not torch.equal(encoders, init)


def test_donor_swap_on_a_tiny_checkpointed_run(tmp_path):
    spec = spec_of("hdcfl", {"groups": 2}, federation__participation=1.0,
                   federation__rounds=2, eval_every=2)
    result = run_experiment(spec, out=str(tmp_path), on_round=lambda *args: None,
                            checkpoint_every=2)
    assert result.status == "ok", result.error
    assert diagnostics.main(["donor-swap", str(tmp_path)]) == 0
    table = pd.read_parquet(tmp_path / "tables" / "donor_swap" / f"{result.trial_id}.parquet")
    assert sorted(table["descriptor"].unique()) == ["lowrank", "raw"]
    assert len(table) == 2 * 6 and (table["donors"] == 5).all()
    assert table["beneficial_rate"].between(0, 1).all()
    assert table["auroc_loss"].dropna().between(0, 1).all()
    assert table["spearman_loss"].dropna().between(-1, 1).all()
    assert np.isfinite(table["top1_minus_random"]).all()
    np.testing.assert_allclose(table["ap_lift"], table["ap"] - table["beneficial_rate"])


def test_donor_swap_without_checkpoints_says_how_to_get_them(tmp_path, capsys):
    run_experiment(spec_of("hdcfl", federation__rounds=1, eval_every=1), out=str(tmp_path))
    assert diagnostics.main(["donor-swap", str(tmp_path)]) == 2
    assert "raylf.sweep" in capsys.readouterr().err
