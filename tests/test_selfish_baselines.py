"""SP-CACW's baselines (FedDisco, FC, FedAMP, Ditto) and the paper's two models."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raylf.config import SpecError, validate
from raylf.data import build_federation
from raylf.methods.base import MethodContext, Uploads
from raylf.methods.ditto import Ditto, DittoParams
from raylf.methods.fc import partition, threshold_clustering
from raylf.methods.fedamp import FedAMP, FedAMPParams, attention_weights, squared_distances
from raylf.methods.feddisco import disco_weights, kl_to_uniform
from raylf.models import MODELS, SplitModel, build_model
from raylf.runtime.blueprint import Blueprint
from raylf.testing import client_round
from raylf.training.layout import ParamLayout
from tests.conftest import small_spec_dict


# ---- FedDisco ----------------------------------------------------------------------------------
def test_feddisco_weights_by_hand():
    counts = np.array([[5, 5], [10, 0], [2, 8]])
    d = kl_to_uniform(counts)
    assert d[0] == 0 and d[1] == pytest.approx(math.log(2))  # 0·log 0 counted as 0
    assert d[2] == pytest.approx(0.2 * math.log(0.4) + 0.8 * math.log(1.6))
    n = counts.sum(1).astype(float)
    p, fallback = disco_weights(n, d, 0.5, 0.1)
    n_bar, d_norm = n / n.sum(), d / d.sum()
    raw = np.maximum(n_bar - 0.5 * d_norm + 0.1, 0)
    assert not fallback and np.allclose(p, raw / raw.sum())
    assert p[0] > p[2] > p[1]  # the balanced client weighs most, the one-class client least


def test_feddisco_falls_back_to_sizes_when_every_weight_is_clipped():
    n, d = np.array([10.0, 30.0]), np.array([1.0, 3.0])
    p, fallback = disco_weights(n, d, a=5.0, b=0.0)
    assert fallback and np.allclose(p, [0.25, 0.75])
    p, fallback = disco_weights(n, np.zeros(2), 0.5, 0.1)  # every client balanced
    assert not fallback and np.allclose(p, (n / 40 + 0.1) / (1 + 0.2))


# ---- FC ----------------------------------------------------------------------------------------
def test_threshold_clustering_by_hand():
    # one model, five peer gradients on a line; start at the model's own gradient 0
    points = torch.tensor([[[0.0], [1.0], [1.5], [10.0], [11.0]]])
    # q = 0.4, n = 5: radius = the sorted distance at index ⌊0.4·5⌋ = 2 (the 3rd smallest)
    v, kept = threshold_clustering(points, torch.tensor([[0.0]]), 1, 0.4)
    # distances 0, 1, 1.5, 10, 11 → radius 1.5: keep 0, 1, 1.5; the rest count as v = 0
    assert v.item() == pytest.approx((0 + 1 + 1.5 + 0 + 0) / 5)
    assert kept.item() == 3
    # a second iteration from v = 0.5: distances 0.5, 0.5, 1, 9.5, 10.5 → radius 1
    v, _ = threshold_clustering(points, torch.tensor([[0.0]]), 2, 0.4)
    assert v.item() == pytest.approx((0 + 1 + 1.5 + 0.5 + 0.5) / 5)


def test_fc_groups_partition_every_client_once():
    groups = partition(seed=3, rnd=7, n=10, groups=3)
    assert sorted(np.concatenate(groups).tolist()) == list(range(10))
    assert sorted(map(len, groups)) == [3, 3, 4]
    assert all(np.array_equal(a, b) for a, b in zip(groups, partition(3, 7, 10, 3)))
    assert [g.tolist() for g in partition(3, 7, 4, 1)] == [[0, 1, 2, 3]]


# ---- FedAMP ------------------------------------------------------------------------------------
def test_fedamp_attention_rows_sum_to_one_with_nonnegative_self_weight():
    torch.manual_seed(0)
    models = torch.cat([torch.zeros(3, 4), 5 + torch.zeros(2, 4)]) + 0.01 * torch.randn(5, 4)
    rows = torch.tensor([0, 3, 4])
    dist = squared_distances(models, rows)
    direct = ((models[rows, None] - models[None]) ** 2).sum(-1).double()
    assert torch.allclose(dist, direct, atol=1e-6)  # the Gram form = direct distances
    for alpha_k, sigma in ((1.0, 1.0), (5.0, 0.5), (0.01, 100.0)):
        xi = attention_weights(dist, rows, alpha_k, sigma)
        assert torch.allclose(xi.sum(1), torch.ones(3, dtype=xi.dtype))
        assert (xi >= 0).all()
    xi = attention_weights(dist, rows, 0.1, 1.0)
    assert xi[0, 1] > xi[0, 3]  # close models attend to each other, far ones barely
    assert xi[0, 0] == pytest.approx(1 - float(xi[0, 1:].sum()))
    off = 0.1 * torch.exp(-direct)
    assert torch.allclose(xi[0, 1:], off[0, 1:], atol=1e-6)


def fedamp_after(models: torch.Tensor, rounds: int = 1, **params):
    """FedAMP's server half after ``rounds`` rounds in which every client uploaded ``models``."""
    n = len(models)
    layout = ParamLayout.of(SplitModel(torch.nn.Identity(), torch.nn.Linear(models.shape[1], 1)))
    ctx = MethodContext(layout, n, np.full(n, 10), 2, rounds, n, seed=0)
    method = FedAMP(FedAMPParams(**params), ctx)
    state = method.server_init(torch.zeros(models.shape[1]))
    uploads = Uploads(np.arange(n), torch.full((n,), 10.0), tensors={"model": models})
    for rnd in range(1, rounds + 1):
        state, diagnostics = method.aggregate(state, uploads, rnd)
    return method, state, diagnostics


def test_fedamp_relative_attention_is_the_same_at_every_model_scale_and_absolute_collapses():
    """Models 1,000× apart in scale (squared distances 10⁶×): the relative attention does not
    change, while the paper's absolute σ = 1 turns FedAMP into local training (ξ_ii = 1)."""
    g = torch.Generator().manual_seed(0)
    base = torch.cat([torch.zeros(3, 5), torch.ones(3, 5)]) + 0.2 * torch.randn(6, 5, generator=g)
    rows = torch.arange(6)
    small, state, first = fedamp_after(base)
    assert "xi_self_mean" not in first  # round 1: every stored model was the common init
    xi = small.weights(state, rows)
    large, big_state, diagnostics = fedamp_after(1000 * base, rounds=2)
    assert torch.allclose(large.weights(big_state, rows), xi, atol=1e-6)
    assert 0 < diagnostics["xi_self_mean"] < 1
    assert diagnostics["xi_self_mean"] == pytest.approx(float(xi.diagonal().mean()))
    assert (xi[:3, :3].sum(1) > xi[:3, 3:].sum(1)).all()  # own cluster weighs more
    _, _, absolute = fedamp_after(1000 * base, rounds=2, scale="absolute", sigma=1.0)
    assert absolute["xi_self_mean"] == 1.0


def test_fedamp_keeps_every_pairwise_distance_current_under_partial_participation():
    g = torch.Generator().manual_seed(1)
    method, state, _ = fedamp_after(torch.randn(5, 4, generator=g))
    moved = torch.tensor([1, 3])
    uploads = Uploads(moved.numpy(), torch.full((2,), 10.0),
                      tensors={"model": torch.randn(2, 4, generator=g)})
    state, _ = method.aggregate(state, uploads, 2)
    everyone = torch.arange(5)
    assert torch.allclose(state["dist"], squared_distances(state["models"], everyone), atol=1e-9)
    assert state["scale"] == pytest.approx(float(torch.median(
        state["dist"][torch.triu_indices(5, 5, 1).unbind()])))


# ---- Ditto -------------------------------------------------------------------------------------
def test_ditto_personal_model_moves_towards_the_global_one_as_lambda_grows():
    spec = validate(small_spec_dict(method={"name": "ditto"}, federation={
        "num_clients": 4, "rounds": 1, "batch_size": 16, "optimizer": {"lr": 0.05}}))
    blueprint = Blueprint(spec, build_federation(spec))
    trainer = blueprint.trainer(torch.device("cpu"))
    data = blueprint.federation.shard(np.arange(4), torch.device("cpu")).client(1)
    start = blueprint.initial_vector()
    anchor = start + 0.5 * torch.randn(start.shape, generator=torch.Generator().manual_seed(0))
    distances = []
    for lam in (0.0, 1.0, 10.0):
        method = Ditto(DittoParams(lam=lam), blueprint.context())
        update = method.local_update(client_round(trainer, data, seed=5,
                                                  payload={"model": anchor},
                                                  personal=start.clone()))
        distances.append(float((update.personal - anchor).norm()))
    assert distances[0] > distances[1] > distances[2]


# ---- the paper's models ------------------------------------------------------------------------
def test_char_lstm_and_vgg16_cifar_shapes():
    lstm = build_model("char_lstm", MODELS.get("char_lstm").Params(hidden=16, embedding=8),
                       (50,), 80)
    assert lstm(torch.randint(0, 80, (3, 50))).shape == (3, 80)
    assert lstm.head.in_features == 16 and lstm.encoder.lstm.num_layers == 2
    params = MODELS.get("vgg16_cifar").Params(width=0.125, hidden=16)
    vgg = build_model("vgg16_cifar", params, (3, 32, 32), 100)
    vgg.eval()
    assert vgg(torch.randn(2, 3, 32, 32)).shape == (2, 100)
    convs = [m for m in vgg.encoder if isinstance(m, torch.nn.Conv2d)]
    drops = [m for m in vgg.encoder if isinstance(m, torch.nn.Dropout2d)]
    assert len(convs) == 13 == len(drops) and drops[0].p == 0.3
    assert isinstance(vgg.head, torch.nn.Linear) and vgg.head.in_features == 16
    with pytest.raises(SpecError, match="32×32"):
        build_model("vgg16_cifar", params, (1, 8, 8), 10)
