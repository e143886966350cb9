"""The halves of IFCA, FedSoft, PACFL, FedALA and FedCE on tiny hand-made tensors."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from raylf.errors import SpecError
from raylf.experiment import run_experiment
from raylf.methods.base import MethodContext, Share
from raylf.methods.fedala import ALA, FedALA, FedALAParams, top_slots
from raylf.methods.fedce import coefficients, floored
from raylf.methods.fedsoft import FedSoft, FedSoftParams, aggregation_weights, importance
from raylf.methods.ifca import IFCA, IFCAParams, lowest_loss
from raylf.methods.pacfl import (
    PACFLParams,
    class_bases,
    cluster,
    entrywise_distances,
    merge_threshold,
    one_cluster_warning,
    principal_distances,
)
from raylf.models import SplitModel
from raylf.schema import OptimizerSpec
from raylf.testing import client_round
from raylf.training.layout import ParamLayout, model_vector
from raylf.training.sequential import LocalTrainer


def tiny_trainer(inputs=2, classes=2, hidden=None, batch_size=4):
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU()) if hidden else nn.Identity()
    model = SplitModel(encoder, nn.Linear(hidden or inputs, classes))
    layout = ParamLayout.of(model)
    opt = OptimizerSpec(lr=0.1)
    init = model_vector(model, layout)
    return LocalTrainer(model, layout, opt, batch_size, 1, torch.device("cpu")), init


def context(trainer, n_clients=4, participants=2, draw=None):
    return MethodContext(trainer.layout, n_clients, np.full(n_clients, 8), 2, 3, participants,
                         seed=0, draw_init=draw)


def separable(n=16, seed=0):
    """Class = sign of the first feature."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    return x, (x[:, 0] > 0).long()


def client(x, y, cid=0, x_val=None, y_val=None):
    return SimpleNamespace(cid=cid, x_train=x, y_train=y, n_train=len(y), x_test=x, y_test=y,
                           x_val=x if x_val is None else x_val,
                           y_val=y if y_val is None else y_val)


# ---- IFCA --------------------------------------------------------------------------------------
def test_ifca_picks_the_model_of_lowest_loss():
    class Scripted:
        """A trainer whose loss is read off the loaded model's first entry."""

        def load(self, v):
            self.loaded = v

        def loss(self, x, y):
            return {0.0: 0.9, 1.0: 0.2, 2.0: 0.5}[float(self.loaded[0])]

    models = torch.arange(3.0)[:, None].repeat(1, 4)
    assert lowest_loss(Scripted(), models, None, None) == 1


def test_ifca_client_joins_the_fitting_model_and_shares_in_its_group():
    trainer, init = tiny_trainer()
    good = init.clone()
    w = trainer.layout.slots[0]
    good[w.offset: w.offset + w.numel] = torch.tensor([[-5.0, 0.0], [5.0, 0.0]]).reshape(-1)
    models = torch.stack([init, init.flip(0), good, -good])
    method = IFCA(IFCAParams(clusters=4, loss_samples=8), context(trainer))
    x, y = separable()
    update = method.local_update(client_round(trainer, client(x, y), seed=1,
                                              payload={"models": models}))
    share = update.upload["model"]
    assert isinstance(share, Share) and share.weights == {2: 16.0}
    deployed = method.deploy(client_round(trainer, client(x, y), payload={"models": models}))
    assert deployed.columns == {"main": {"cluster": 2}}
    trainer.load(deployed.models["main"])
    assert method.scores(trainer.predict(x), y)[0]["accuracy"] == 1.0


# ---- PACFL -------------------------------------------------------------------------------------
def test_principal_angle_of_two_lines_is_their_angle():
    theta = 0.3
    a = torch.tensor([[1.0], [0.0], [0.0]])
    b = torch.tensor([[math.cos(theta)], [math.sin(theta)], [0.0]])
    d = principal_distances(torch.stack([a, b]))
    assert d[0, 1].item() == pytest.approx(theta, abs=1e-6)
    assert d[0, 0].item() == 0


def test_principal_angle_ignores_zero_columns_and_non_orthonormal_columns():
    theta = 0.7
    e1, e2, e3 = torch.eye(4)[:3]
    # client 0 spans {e1, e2} through two non-orthogonal unit columns, plus a zero column
    first = torch.stack([e1, (e1 + e2) / math.sqrt(2), torch.zeros(4)], 1)
    # client 1 spans {cos·e1 + sin·e3}, then a zero column, then e4 (orthogonal to client 0)
    second = torch.stack([math.cos(theta) * e1 + math.sin(theta) * e3, torch.zeros(4),
                          torch.eye(4)[3]], 1)
    d = principal_distances(torch.stack([first, second]))
    assert d[0, 1].item() == pytest.approx(theta, abs=1e-7)
    # a shared direction gives angle 0
    shared = torch.stack([e2, torch.zeros(4), torch.zeros(4)], 1)
    assert principal_distances(torch.stack([first, shared]))[0, 1].item() == pytest.approx(
        0, abs=1e-6)


def test_entrywise_distance_is_the_smallest_column_angle_in_degrees_without_zero_columns():
    a = torch.tensor([[1.0, 0.0], [0.0, 0.0]])  # e1 and a zero column
    b = torch.tensor([[-0.5, 0.0], [math.sqrt(3) / 2, 0.0]])  # 120° from e1, a zero column
    d = entrywise_distances(torch.stack([a, b]))
    assert d[0, 1].item() == pytest.approx(120.0)  # not the 90° a zero column would give


def test_class_bases_are_orthonormal_per_class_with_zero_columns_for_missing_classes():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 2, 3, generator=g)
    y = torch.tensor([0] * 7 + [2] * 5)
    u = class_bases(x, y, num_classes=3, p=2)
    assert u.shape == (6, 6)
    assert torch.allclose(u[:, :2].T @ u[:, :2], torch.eye(2), atol=1e-5)
    assert torch.count_nonzero(u[:, 2:4]) == 0
    top = torch.linalg.svd(x[y == 2].reshape(5, -1).T.double()).U[:, 0].float()
    assert abs(float(u[:, 4] @ top)) == pytest.approx(1, abs=1e-5)


def test_agglomerative_clusters_merge_within_the_threshold():
    d = np.array([[0, 0.1, 1.0, 1.1], [0.1, 0, 1.2, 1.0], [1.0, 1.2, 0, 0.2],
                  [1.1, 1.0, 0.2, 0]])
    assert cluster(d, 0.5, "average").tolist() == [0, 0, 1, 1]
    assert len(set(cluster(d, 1.5, "weighted").tolist())) == 1
    assert len(set(cluster(d, 0.05, "average").tolist())) == 4


def test_pacfl_says_when_its_threshold_makes_one_cluster():
    d = np.array([[0, 0.3], [0.3, 0]])
    paper = PACFLParams(threshold_scale="absolute", threshold=1.5)
    message = one_cluster_warning(d, merge_threshold(d, paper), paper)
    assert "β = 1.5 rad" in message and "largest 0.3 rad" in message
    assert "threshold_scale: relative" in message
    relative = PACFLParams()
    message = one_cluster_warning(d, merge_threshold(d, relative), relative)
    assert f"β = {0.3 * relative.threshold:.3g} rad" in message  # nearest neighbour: 0.3
    assert "lower method.params.threshold" in message


def test_relative_threshold_finds_groups_in_any_unit_where_the_papers_merges_everyone():
    """Two groups of three whose subspaces lie about 0.01 rad apart inside a group and 0.1 rad
    across (raw images: every angle small): 1.5 rad merges all six; the threshold relative to
    the nearest-neighbour distance splits the groups, the same in radians and in degrees."""
    g = np.random.default_rng(0)
    groups = np.array([0, 0, 0, 1, 1, 1])
    d = np.where(groups[:, None] == groups[None], 0.01, 0.1) * (1 + 0.1 * g.random((6, 6)))
    d = np.triu(d, 1) + np.triu(d, 1).T
    paper = PACFLParams(threshold_scale="absolute", threshold=1.5)
    assert len(set(cluster(d, merge_threshold(d, paper), "average"))) == 1
    ids = cluster(d, merge_threshold(d, PACFLParams()), "average")
    assert ids.tolist() == groups.tolist()
    degrees = np.rad2deg(d)
    assert cluster(degrees, merge_threshold(degrees, PACFLParams(distance="entrywise")),
                   "average").tolist() == groups.tolist()


# ---- FedALA ------------------------------------------------------------------------------------
def test_fedala_weights_stay_in_the_unit_interval_and_only_the_top_tensors_mix():
    trainer, init = tiny_trainer(hidden=3)
    slots = top_slots(trainer.layout.slots, 2)
    assert [s.name for s in slots] == ["head.weight", "head.bias"]
    glob = init + 1.0
    local = init - 2.0
    x, y = separable(32)
    ala = ALA(trainer, slots, local, glob)
    trainer.load(ala.base)
    weights = torch.ones(sum(s.numel for s in slots))
    for _ in range(3):
        weights, loss = ala.one_pass(weights, x, y, eta=50.0, gen=torch.Generator())
        assert math.isfinite(loss)
        assert float(weights.min()) >= 0 and float(weights.max()) <= 1
    assert (weights < 1).any()  # the weights did move
    mixed = ala.model(weights)
    top = slots[0].offset
    assert torch.equal(mixed[:top], glob[:top])  # lower layers: the global model
    assert torch.allclose(mixed[top:], local[top:] + (glob[top:] - local[top:]) * weights)


def test_fedala_first_round_skips_ala_and_the_start_phase_runs_once():
    trainer, init = tiny_trainer(hidden=3)
    method = FedALA(FedALAParams(start_passes=5), context(trainer))
    personal = method.client_init(0, init)
    x, y = separable(32)
    data = client(x, y)
    start, after = method.adapt(trainer, init, personal, data, seed=1)
    assert torch.equal(start, init) and after["started"] is False
    update = method.local_update(client_round(trainer, data, seed=1,
                                              payload={"model": init + 0.5}, personal=personal))
    assert update.personal["started"] is True
    assert torch.equal(update.upload["model"], update.personal["model"])


# ---- FedCE -------------------------------------------------------------------------------------
@pytest.mark.parametrize("values", [[5.0, 1e-9, 0.0, 2.0], [1.0, 1.0, 1.0], [-1.0, 3.0],
                                    [1e-6] * 3 + [1.0]])
def test_fedce_floored_coefficients_sum_to_one_and_respect_the_floor(values):
    c = floored(torch.tensor(values), 1e-3)
    assert float(c.sum()) == pytest.approx(1, abs=1e-12)
    assert float(c.min()) >= 1e-3 - 1e-15


@pytest.mark.parametrize("mode", ["plus", "times"])
def test_fedce_coefficients_favour_the_update_unlike_the_others(mode):
    delta = torch.tensor([[1.0, 0.1], [1.0, -0.1], [0.9, 0.0], [-1.0, 0.0]], dtype=torch.float64)
    current = torch.full((4,), 0.25, dtype=torch.float64)
    dc = torch.full((4,), 0.5, dtype=torch.float64)
    history = torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)
    c, (sums, counts) = coefficients(delta, current, dc, history, mode, 1e-3)
    assert float(c.sum()) == pytest.approx(1) and float(c.min()) >= 1e-3
    assert int(c.argmax()) == 3 and counts.tolist() == [1, 1, 1, 1]


def test_fedce_refuses_a_scenario_without_validation_data(small_spec):
    with pytest.raises(SpecError, match="scenario.val_fraction"):
        run_experiment(small_spec(method__name="fedce"))


def test_fedce_refuses_a_single_participant(small_spec):
    with pytest.raises(SpecError, match="federation.participation"):  # when validated
        small_spec(method__name="fedce", federation__participation=0.1,
                   scenario__val_fraction=0.1)


# ---- FedSoft -----------------------------------------------------------------------------------
def test_fedsoft_importance_shares_sum_to_one_before_smoothing():
    losses = torch.tensor([[0.1, 0.9, 0.2, 0.8, 0.3],
                           [0.5, 0.1, 0.6, 0.1, 0.9],
                           [0.9, 0.9, 0.9, 0.9, 0.9]])
    u = importance(losses, smoothing=1e-4)
    assert u[:2].tolist() == pytest.approx([0.6, 0.4])  # the raw shares sum to 1
    assert float(u[2]) == 1e-4  # a cluster no sample chose gets σ


def test_fedsoft_aggregation_weights_sum_to_one_per_cluster():
    u = torch.tensor([[0.7, 0.3], [1e-4, 1.0], [0.5, 0.5]], dtype=torch.float64)
    v = aggregation_weights(u, torch.tensor([10, 20, 30]))
    assert v.shape == (2, 3)
    assert v.sum(1).tolist() == pytest.approx([1, 1])
    assert float(v[0, 0]) == pytest.approx(7 / (7 + 20e-4 + 15))


def test_fedsoft_proximal_anchor_has_the_gradient_of_the_sum_of_terms():
    g = torch.Generator().manual_seed(0)
    clusters, w = torch.randn(3, 5, generator=g), torch.randn(5, generator=g)
    u, lam = torch.tensor([0.6, 0.4, 1e-4]), 0.1
    w.requires_grad_(True)
    (lam / 2 * (u[:, None] * (w - clusters) ** 2).sum()).backward()
    total = u.sum()
    anchor = (u / total) @ clusters
    assert torch.allclose(w.grad, lam * total * (w.detach() - anchor), atol=1e-6)


def test_fedsoft_selection_draws_k_distinct_clients_per_cluster_and_trains_their_union():
    trainer, init = tiny_trainer()
    models = torch.stack([init, init + 1])
    method = FedSoft(FedSoftParams(clusters=2, per_cluster=3),
                     context(trainer, n_clients=6, participants=4, draw=lambda i: models[i]))
    state = method.server_init(init)
    chosen = method.chosen(state, rnd=1)
    assert chosen.shape == (2, 3) and all(len(set(row.tolist())) == 3 for row in chosen)
    assert method.select(state, 1, None).tolist() == sorted(set(chosen.reshape(-1).tolist()))
    assert torch.equal(method.broadcast(state, 1)["chosen"], chosen)


# ---- through a run -----------------------------------------------------------------------------
def test_ifca_and_pacfl_record_each_clients_cluster(small_spec):
    for name in ("ifca", "pacfl"):
        spec = small_spec(method__name=name, federation__rounds=1, scenario__val_fraction=0.2,
                          federation__num_clients=6)
        result = run_experiment(spec)
        assert result.status == "ok", result.error
        rows = result.tables["clients"]
        by_split = {(r["split"], r["client_id"]): r["cluster"] for r in rows}
        assert all(by_split[("test", c)] == by_split[("val", c)] for c in range(6))
