"""MOON, FedProto, FedRoD, SCAFFOLD and FedFomo: each one's distinctive arithmetic against a
hand-computed reference on a tiny example, and the wiring that makes the first four plans (their
loss terms see the features, the outputs and the reference models they name)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raylf.data import build_federation
from raylf.data.federation import ClientData
from raylf.errors import SpecError
from raylf.experiment import run_experiment
from raylf.methods import METHODS, Method, MethodContext
from raylf.methods.base import MethodParams, Uploads
from raylf.methods.fedavg import FedAvg
from raylf.methods.fedfomo import (
    FedFomo,
    FedFomoParams,
    combined,
    epsilon_greedy,
    first_order_weights,
)
from raylf.methods.fedproto import (
    FedProto,
    FedProtoParams,
    class_sums,
    prototype_head,
    prototype_loss,
)
from raylf.methods.fedrod import FedRoD, TwoHeads, balanced_softmax_loss
from raylf.methods.moon import MOON, MOONParams, model_contrastive_loss
from raylf.methods.scaffold import Scaffold, ScaffoldParams, correction, effective_steps
from raylf.models import SplitModel
from raylf.runtime import Blueprint
from raylf.schema import OptimizerSpec
from raylf.testing import client_round, contract_spec
from raylf.training import sgd
from raylf.training.layout import ParamLayout, model_vector
from raylf.training.objective import Batch
from raylf.training.sequential import LocalTrainer


def tiny(head: nn.Module | None = None, inputs: int = 2, hidden: int = 3, classes: int = 3,
         lr: float = 0.1, momentum: float = 0.0):
    """A trainer of a one-hidden-layer model, its initialization and a method context."""
    torch.manual_seed(0)
    model = SplitModel(nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU()),
                       head or nn.Linear(hidden, classes))
    layout = ParamLayout.of(model)
    trainer = LocalTrainer(model, layout, OptimizerSpec(lr=lr, momentum=momentum), 4, 2,
                           torch.device("cpu"))
    ctx = MethodContext(layout, 4, np.full(4, 12), classes, 3, 2, seed=0, batch_size=4,
                        local_epochs=2)
    return trainer, model_vector(model, layout), ctx


def data(n: int = 12, inputs: int = 2, classes: int = 3, seed: int = 0) -> ClientData:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, inputs, generator=g)
    y = torch.arange(n) % classes
    return ClientData(0, 0, x, y, x, y)


def test_the_methods_whose_loss_needs_features_and_scaffold_are_plans_and_fedfomo_is_not():
    """The methods whose loss needs features (MOON, FedProto, FedRoD) and SCAFFOLD's corrected
    steps are plans, so the contract suite's cohort check runs on them; FedFomo decides its
    start with the trainer, so it runs its own update."""
    for name in ("moon", "fedproto", "fedrod", "scaffold"):
        cls = METHODS.get(name)
        assert cls.plan is not Method.plan and cls.local_update is Method.local_update, name
    assert METHODS.get("fedfomo").local_update is not Method.local_update


# ---- MOON ---------------------------------------------------------------------------------------
def test_moon_contrastive_loss_matches_the_paper_on_two_samples():
    z = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    z_glob = torch.tensor([[2.0, 0.0], [1.0, 0.0]])  # cosine 1 and 1/√2
    z_prev = torch.tensor([[0.0, 3.0], [-1.0, -1.0]])  # cosine 0 and −1
    tau = 0.5
    expected = [-math.log(math.exp(1 / tau) / (math.exp(1 / tau) + math.exp(0 / tau))),
                -math.log(math.exp(2 ** -0.5 / tau)
                          / (math.exp(2 ** -0.5 / tau) + math.exp(-1 / tau)))]
    assert float(model_contrastive_loss(z, z_glob, z_prev, tau)) == \
        pytest.approx(sum(expected) / 2, rel=1e-6)


def test_moon_term_reads_the_global_and_previous_models():
    """With the previous local model equal to the received one the term's gradient is exactly
    zero (MOON's round 1 is FedAvg's update, bit for bit); with another previous model it acts."""
    trainer, init, ctx = tiny()
    client = data()
    moon, fedavg = MOON(MOONParams(mu=5.0), ctx), FedAvg(MethodParams(), ctx)
    plain = fedavg.local_update(client_round(trainer, client, payload={"model": init}))
    same = moon.local_update(client_round(trainer, client, payload={"model": init},
                                          personal=init.clone()))
    other = moon.local_update(client_round(trainer, client, payload={"model": init},
                                           personal=init + 0.5))
    assert torch.equal(same.upload["model"], plain.upload["model"])
    assert torch.equal(same.personal, same.upload["model"])  # kept as next round's w_i^{t-1}
    assert not torch.allclose(other.upload["model"], plain.upload["model"])


# ---- FedProto -----------------------------------------------------------------------------------
def test_fedproto_prototype_term_counts_only_classes_with_a_prototype():
    features = torch.tensor([[1.0, 2.0], [0.0, -1.0], [5.0, 5.0]])
    labels = torch.tensor([0, 1, 2])
    prototypes = torch.tensor([[0.0, 0.0], [1.0, 1.0], [9.0, 9.0]])
    present = torch.tensor([True, True, False])
    expected = ((1 + 4) + (1 + 4)) / 6  # class 2 has no prototype: its row counts as zero
    assert float(prototype_loss(features, labels, prototypes, present)) == pytest.approx(expected)


def test_fedproto_nearest_prototype_head_scores_minus_the_squared_distance():
    prototypes = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 3.0]])
    present = torch.tensor([True, True, False])
    weight, bias = prototype_head(prototypes, present)
    z = torch.tensor([[1.5, 0.2], [0.1, 2.9]])
    logits = F.linear(z, weight, bias)
    distance = ((z[:, None] - prototypes[None]) ** 2).sum(-1)
    assert torch.allclose(logits[:, :2] - (z ** 2).sum(1, keepdim=True), -distance[:, :2])
    assert torch.isneginf(logits[:, 2]).all()  # no prototype: never predicted
    assert logits.argmax(1).tolist() == [1, 0]  # the second is nearest class 2, which has none


@pytest.mark.parametrize("weighting, class0", [("samples", [4 / 3, 0.0]),
                                               ("clients", [1.0, 0.0])])
def test_fedproto_server_averages_class_prototypes_and_keeps_unheld_ones(weighting, class0):
    """Two clients answer through the real phase (an identity encoder: the features are the
    inputs); the server's prototypes are the count-weighted (paper) or the clients' plain mean
    (authors' code) per class, and a class nobody held keeps its earlier prototype."""
    torch.manual_seed(0)
    model = SplitModel(nn.Identity(), nn.Linear(2, 3))
    layout = ParamLayout.of(model)
    trainer = LocalTrainer(model, layout, OptimizerSpec(), 4, 1, torch.device("cpu"))
    ctx = MethodContext(layout, 2, np.array([3, 1]), 3, 3, 2, seed=0)
    method = FedProto(FedProtoParams(weighting=weighting), ctx)
    init = model_vector(model, layout)
    a = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    answers = [method.local_prototypes(client_round(trainer, ClientData(c, 0, x, y, x, y),
                                                    personal=init)).upload["class_sums"]
               for c, (x, y) in enumerate([(a, torch.tensor([0, 0, 1])),
                                           (torch.zeros(1, 2), torch.tensor([0]))])]
    uploads = Uploads(np.array([0, 1]), torch.tensor([3, 1]),
                      sums={"class_sums": {0: sum(s.value.double() for s in answers)}},
                      weights={"class_sums": {0: 2.0}})
    earlier = torch.tensor([[9.0, 9.0], [9.0, 9.0], [7.0, 7.0]])
    state = method.server_init(init) | {"prototypes": earlier}
    state, _ = method.global_prototypes(state, uploads, 1)
    assert torch.allclose(state["prototypes"], torch.tensor([class0, [0.0, 2.0], [7.0, 7.0]]))
    assert state["present"].tolist() == [True, True, False]


def test_fedproto_class_sums():
    sums, counts = class_sums(torch.tensor([[1.0, 1.0], [2.0, 0.0], [5.0, 5.0]]),
                              torch.tensor([1, 1, 0]), 3)
    assert sums.tolist() == [[5.0, 5.0], [3.0, 1.0], [0.0, 0.0]]
    assert counts.tolist() == [1.0, 2.0, 0.0]


# ---- FedRoD -------------------------------------------------------------------------------------
def test_fedrod_balanced_softmax_matches_the_hand_computed_loss():
    """Logits (1, 2, 0), label 1, counts (3, 1, 0): −log(e²/(3e¹ + 1e²)); the class the client
    lacks drops out, with a finite gradient."""
    logits = torch.tensor([[1.0, 2.0, 0.0]], requires_grad=True)
    loss = balanced_softmax_loss(logits, torch.tensor([1]), torch.tensor([3, 1, 0]))
    assert float(loss.detach()) == pytest.approx(math.log(3 * math.e + math.e ** 2) - 2)
    loss.backward()
    assert torch.isfinite(logits.grad).all() and float(logits.grad[0, 2]) == 0.0


def test_fedrod_personal_loss_trains_the_personal_head_and_the_term_the_generic_model():
    """The plan's data loss (cross-entropy of the personalized prediction) reaches only the
    personal head; the balanced-softmax term only the encoder and the generic head; the
    ``generic`` deployment (personal head at zero) outputs the generic logits."""
    torch.manual_seed(0)
    trainer, init, ctx = tiny(head=TwoHeads(nn.Linear(3, 3)))
    method = FedRoD(MethodParams(), ctx)
    client = data()
    plan = method.plan(client_round(trainer, client, payload=method.broadcast(
        method.server_init(init), 1), personal=method.client_init(0, init)))
    model, named = trainer.model, dict(trainer.model.named_parameters())
    trainer.load(init + 0.1)  # a non-zero personal head
    x, y = client.x_train, client.y_train

    def gradients(loss_of):
        model.zero_grad(set_to_none=True)
        features = model.encoder(x)
        outputs = model.head(features)
        loss_of(features, outputs).backward()
        return {n for n, p in named.items() if p.grad is not None and p.grad.abs().sum() > 0}

    assert gradients(lambda f, o: F.cross_entropy(o, y)) == {"head.personal_weight",
                                                             "head.personal_bias"}
    term = plan.terms[0]
    assert gradients(lambda f, o: term(Batch(x, y, f, o, named, {}))) == {
        "encoder.0.weight", "encoder.0.bias", "head.generic_weight", "head.generic_bias"}
    received = method.broadcast(method.server_init(init + 0.1), 2)
    deployed = method.deploy(client_round(trainer, client, payload=received,
                                          personal=torch.ones_like(method.client_init(0, init))))
    trainer.load(deployed.models["generic"])
    generic = F.linear(model.encoder(x), named["head.generic_weight"],
                       named["head.generic_bias"])
    assert torch.allclose(trainer.predict(x), generic.detach())


# ---- SCAFFOLD -----------------------------------------------------------------------------------
@pytest.mark.parametrize("momentum, expected", [(0.0, 3.0), (0.5, 1 + 1.5 + 1.75)])
def test_scaffold_effective_steps_are_the_displacement_of_sgd(momentum, expected):
    """K = 3 steps of a constant gradient g with the trainers' SGD (torch's) move the weights by
    lr·g·effective_steps: Σ_j (1 − β^j)/(1 − β), 3 for plain SGD."""
    assert effective_steps(3, momentum) == pytest.approx(expected)
    w = torch.zeros(1, 2)  # a client dimension of one, as the trainers step
    cfg = OptimizerSpec(lr=0.1, momentum=momentum)
    state = sgd.zero_state([w], cfg)
    g = torch.tensor([[1.0, -2.0]])
    for step in range(3):
        sgd.step_([w], [g.clone()], state, cfg, step=step + 1)
    assert torch.allclose(-w, 0.1 * g * expected)


def test_scaffold_correction_term_has_the_gradient_c_minus_c_i():
    trainer, init, ctx = tiny()
    control = torch.randn(ctx.layout.size)
    named = {n: p.detach().clone().requires_grad_(True)
             for n, p in trainer.model.named_parameters()}
    term = correction(control, ctx.layout)
    grads = torch.autograd.grad(term(Batch(None, None, None, None, named, {})),
                                list(named.values()))
    for slot, grad in zip((s for s in ctx.layout.slots if s.is_param), grads):
        assert torch.equal(grad.flatten(), control[slot.offset: slot.offset + slot.numel])


def test_scaffold_client_updates_its_variate_by_option_two():
    """Plain SGD: c_i⁺ = c_i − c + (x − y)/(K η) with K the schedule's 2 epochs of 3 steps; the
    uploads are Δy and Δc, and zero variates leave FedAvg's update."""
    trainer, init, ctx = tiny()
    client = data()
    method = Scaffold(ScaffoldParams(), ctx)
    server, own = 0.01 * torch.randn(ctx.layout.size), 0.02 * torch.randn(ctx.layout.size)
    update = method.local_update(client_round(
        trainer, client, payload={"model": init, "control": server}, personal=own))
    trained = init + update.upload["delta_model"].value
    expected = own - server + (init - trained) / (6 * 0.1)
    assert torch.allclose(update.personal, expected, atol=1e-6)
    assert torch.allclose(update.upload["delta_control"].value, expected - own, atol=1e-6)
    zero = method.local_update(client_round(
        trainer, client, payload={"model": init, "control": torch.zeros_like(init)},
        personal=torch.zeros_like(init)))
    plain = FedAvg(MethodParams(), ctx).local_update(
        client_round(trainer, client, payload={"model": init}))
    assert torch.equal(init + zero.upload["delta_model"].value, plain.upload["model"])


def test_scaffold_server_takes_unweighted_means_and_scales_the_variate_by_s_over_n():
    _, init, ctx = tiny()  # N = 4 clients
    method = Scaffold(ScaffoldParams(server_lr=0.5), ctx)
    dy = [torch.full_like(init, 1.0), torch.full_like(init, 3.0)]
    dc = [torch.full_like(init, 2.0), torch.full_like(init, 6.0)]
    uploads = Uploads(np.array([0, 2]), torch.tensor([12, 1]),  # n_k play no part
                      sums={"delta_model": {0: (dy[0] + dy[1]).double()},
                            "delta_control": {0: (dc[0] + dc[1]).double()}},
                      weights={"delta_model": {0: 2.0}, "delta_control": {0: 2.0}})
    state, _ = method.aggregate(method.server_init(init), uploads, 1)
    assert torch.allclose(state["model"], init + 0.5 * 2.0)
    assert torch.allclose(state["control"], torch.full_like(init, 2 / 4 * 4.0))


@pytest.mark.parametrize("name", ["scaffold", "fedproto"])
def test_bytes_count_twice_the_model_for_scaffold_and_the_prototypes_for_fedproto(name):
    spec = contract_spec(name, rounds=1)
    record, = (r for r in run_experiment(spec).tables["rounds"] if r["round"] == 1)
    participants = record["participants"]
    blueprint = Blueprint(spec, build_federation(spec))
    size, classes = blueprint.layout.size, blueprint.federation.num_classes
    if name == "scaffold":  # x and c down; Δy and Δc up, each a share naming one group
        assert record["bytes_down"] == participants * 2 * 4 * size
        assert record["bytes_up"] == participants * 2 * (4 * size + 8)
    else:  # prototypes and which classes have one down; per class a sum and a count up
        features = 16  # contract_spec's mlp
        assert record["bytes_down"] == participants * (4 * classes * features + classes)
        assert record["bytes_up"] == participants * (4 * classes * (features + 1) + 8)


# ---- FedFomo ------------------------------------------------------------------------------------
def test_fedfomo_first_order_weights_and_the_combination():
    weights = first_order_weights(1.0, torch.tensor([0.5, 1.5, 0.2]),
                                  torch.tensor([2.0, 1.0, 0.0]))
    assert weights.tolist() == [0.25, -0.5, 0.0]  # the same model (distance 0) weighs nothing
    own = torch.zeros(2)
    peers = torch.tensor([[2.0, 0.0], [0.0, 4.0]])
    assert combined(own, peers, torch.tensor([1.0, -1.0])).tolist() == [2.0, 0.0]
    assert combined(own, peers, torch.tensor([1.0, 3.0])).tolist() == [0.5, 3.0]
    assert combined(own, peers, torch.tensor([-1.0, 0.0])).tolist() == [0.0, 0.0]


def test_fedfomo_downloads_the_peers_of_highest_affinity_or_explores():
    affinity = np.array([0.0, 0.3, -1.0, 2.0, 0.1])
    candidates = np.array([1, 2, 3, 4])
    greedy = epsilon_greedy(affinity, candidates, 2, 0.0, np.random.default_rng(0))
    assert greedy.tolist() == [3, 1]
    assert sorted(epsilon_greedy(affinity, candidates, 9, 1.0,
                                 np.random.default_rng(0)).tolist()) == [1, 2, 3, 4]


def test_fedfomo_client_moves_to_the_helpful_peer_and_the_server_learns_its_affinity():
    """A peer fitted to the client's data lowers its validation loss (weight > 0), a worse one
    raises it (< 0): the client starts from the helpful peer alone, uploads both weights, and
    the server adds them to its affinity row for the peers it sent."""
    trainer, init, ctx = tiny()
    client = data(n=40)
    trainer.load(init)
    trainer.fit(client.x_train, client.y_train, seed=0, epochs=20)
    good = trainer.vector()
    method = FedFomo(FedFomoParams(models=3, epsilon=0.0), ctx)
    state = method.server_init(init)
    state["models"][1], state["models"][2] = good, init - 2 * (good - init)
    state["seen"][[1, 2]] = True
    extra = method.extras(state, np.array([0]), 1)[0]
    assert len(extra) == 2
    update = method.local_update(client_round(trainer, client, personal=init, extra=extra,
                                              rnd=1))
    weights = update.upload["weights"]
    order = method.peers(state, 0, 1).tolist()
    assert weights[order.index(1)] > 0 > weights[order.index(2)] and weights[2] == 0
    train_rows, val_rows = method.split(client)
    trainer.load(good)  # the start: the helpful peer's model, fitted on the training share
    trainer.fit(client.x_train[train_rows], client.y_train[train_rows], seed=0)
    assert torch.allclose(update.upload["model"], trainer.vector(), atol=1e-5)
    new, diagnostics = method.aggregate(state, Uploads(
        np.array([0]), torch.tensor([40]),
        tensors={"model": update.upload["model"][None], "weights": weights[None]}), 1)
    assert torch.allclose(new["affinity"][0, order], weights[:2].double())
    assert diagnostics == {"fomo_kept_mean": 1.0}
    assert bool(new["seen"][0]) and torch.equal(new["models"][0], update.upload["model"])
    assert len(val_rows) == 8 and not set(val_rows.tolist()) & set(train_rows.tolist())
    assert torch.equal(method.split(client)[1], val_rows)  # fixed across rounds


@pytest.mark.parametrize("method", [FedRoD, FedProto])
def test_a_head_that_is_not_linear_is_refused_naming_the_model(method):
    """FedRoD puts a second linear head beside the model's, FedProto replaces it by the
    nearest-prototype one: a model whose head is not a linear layer is a spec error."""
    def spec_model(outputs):
        return SplitModel(nn.Identity(), nn.Sequential(nn.Linear(2, outputs)))

    with pytest.raises(SpecError, match="model.name"):
        method.build_model(spec_model, SimpleNamespace(num_classes=3), method.Params())


def test_the_method_context_knows_how_many_steps_a_fit_of_the_federation_takes():
    spec = contract_spec("scaffold", federation={"local_epochs": 2, "batch_size": 16})
    blueprint = Blueprint(spec, build_federation(spec))
    ctx = blueprint.context()
    assert (ctx.batch_size, ctx.local_epochs) == (16, 2)
    client = blueprint.federation.shard(np.array([0]), torch.device("cpu")).client(0)
    trainer = blueprint.trainer(torch.device("cpu"))
    fit = trainer.fit(client.x_train, client.y_train, seed=0)
    assert fit.steps == ctx.local_steps(client.n_train) == 2 * math.ceil(client.n_train / 16)
