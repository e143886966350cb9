"""FedRep, LG-FedAvg, APFL, pFedMe and Per-FedAvg: each one's own arithmetic against a reference
computed here, by torch autograd on the same tiny model, from the papers' equations."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from raylf.config import SpecError, validate
from raylf.data import build_federation
from raylf.methods.apfl import APFL, APFLParams
from raylf.methods.base import MethodParams, Uploads, run_plan
from raylf.methods.fedrep import FedRep, FedRepParams
from raylf.methods.lgfedavg import LGFedAvg
from raylf.methods.perfedavg import PerFedAvg, PerFedAvgParams
from raylf.methods.pfedme import PFedMe, PFedMeParams
from raylf.runtime.blueprint import Blueprint
from raylf.seeding import derive
from raylf.testing import check_method, client_round
from tests.conftest import small_spec_dict

LR = 0.05  # the federation's step η (β for Per-FedAvg): plain SGD, no momentum
BATCH = 16  # one client holds exactly one minibatch: every step sees all of it, in any order


@pytest.fixture(scope="module")
def tiny():
    """A blueprint with an 8-unit MLP, a trainer, one client cut to one minibatch, the init and
    a second model some distance from it."""
    spec = validate(small_spec_dict(
        model={"name": "mlp", "hidden": [8]},
        federation={"num_clients": 4, "rounds": 1, "batch_size": BATCH,
                    "optimizer": {"lr": LR, "momentum": 0.0}}))
    blueprint = Blueprint(spec, build_federation(spec))
    trainer = blueprint.trainer(torch.device("cpu"))
    data = blueprint.federation.shard(np.arange(4), torch.device("cpu")).client(1)
    data = replace(data, x_train=data.x_train[:BATCH], y_train=data.y_train[:BATCH])
    init = blueprint.initial_vector()
    other = init + 0.3 * torch.randn(init.shape, generator=torch.Generator().manual_seed(0))
    return blueprint, trainer, data, init, other


def loss_at(trainer, vector: torch.Tensor, data) -> torch.Tensor:
    """The client's mean cross-entropy at a flat vector, differentiable in it."""
    params = {s.name: vector[s.offset: s.offset + s.numel].view(s.shape)
              for s in trainer.layout.slots}
    return F.cross_entropy(functional_call(trainer.model, params, (data.x_train,)), data.y_train)


def grad_at(trainer, vector: torch.Tensor, data) -> torch.Tensor:
    leaf = vector.detach().clone().requires_grad_(True)
    return torch.autograd.grad(loss_at(trainer, leaf, data), leaf)[0]


# ---- FedRep --------------------------------------------------------------------------------------
def test_fedrep_fits_the_head_on_the_received_body_then_the_body_under_the_new_head(tiny):
    blueprint, trainer, data, init, other = tiny
    layout = blueprint.layout
    encoder, head = layout.part("encoder"), layout.part("head")
    method = FedRep(FedRepParams(head_epochs=3), blueprint.context())
    received = other[encoder]
    client = client_round(trainer, data, seed=7, payload={"encoder": received},
                          personal=init[head].clone())
    update = run_plan(method.plan(client), client)

    start = torch.cat([received, init[head]])  # by hand: the head alone, then the body alone
    trainer.load(start)
    trainer.fit(data.x_train, data.y_train, seed=derive(7, "method", 0), trainable=("head",),
                epochs=3)
    new_head = trainer.vector()
    assert torch.equal(new_head[encoder], received)  # the body stayed as received
    trainer.fit(data.x_train, data.y_train, seed=7, trainable=("encoder",))
    trained = trainer.vector()
    assert torch.equal(trained[head], new_head[head])  # the new head stayed for the body's fit
    assert set(update.upload) == {"encoder"}  # only the body goes up
    assert torch.equal(update.upload["encoder"], trained[encoder])
    assert torch.equal(update.personal, new_head[head])
    assert not torch.equal(update.personal, init[head])


# ---- LG-FedAvg -----------------------------------------------------------------------------------
def test_lg_fedavg_shares_the_head_and_keeps_the_encoder(tiny):
    blueprint, trainer, data, init, other = tiny
    layout = blueprint.layout
    encoder, head = layout.part("encoder"), layout.part("head")
    method = LGFedAvg(MethodParams(), blueprint.context())
    state = method.server_init(init)
    assert set(state) == {"head"} and torch.equal(state["head"], init[head])
    own = method.client_init(1, init)
    assert torch.equal(own, init[encoder])

    client = client_round(trainer, data, seed=3, payload={"head": other[head]},
                          personal=other[encoder])
    update = run_plan(method.plan(client), client)
    trainer.load(torch.cat([other[encoder], other[head]]))
    trainer.fit(data.x_train, data.y_train, seed=3)  # both parts trained together
    assert set(update.upload) == {"head"}
    assert torch.equal(update.upload["head"], trainer.vector()[head])
    assert torch.equal(update.personal, trainer.vector()[encoder])

    heads = torch.stack([init[head], other[head]])
    n = torch.tensor([10.0, 30.0])
    uploads = Uploads(np.array([0, 2]), n, sums={"head": {0: (n[:, None] * heads).sum(0)
                                                           .double()}},
                      weights={"head": {0: 40.0}})
    state, _ = method.aggregate(state, uploads, 1)
    assert torch.allclose(state["head"], 0.25 * init[head] + 0.75 * other[head])
    deployed = method.deploy(client_round(trainer, data, payload=state,
                                          personal=update.personal)).models["main"]
    assert torch.equal(deployed, torch.cat([update.personal, state["head"]]))


# ---- APFL ----------------------------------------------------------------------------------------
def test_apfl_step_moves_w_by_its_gradient_and_v_and_alpha_through_the_mixed_model(tiny):
    """One local step against Algorithm 1 with autograd: w − η∇f(w), v − η∂f(v̄)/∂v and
    α − η ∂f(v̄)/∂α, all at the previous iterates, v̄ = αv + (1 − α)w."""
    blueprint, trainer, data, init, other = tiny
    alpha, alpha_lr = 0.3, 0.2
    method = APFL(APFLParams(alpha=alpha, alpha_lr=alpha_lr), blueprint.context())
    w, v = init, other
    update = method.local_update(client_round(trainer, data, seed=1, payload={"model": w},
                                              personal={"model": v, "alpha": alpha}))

    v_leaf = v.clone().requires_grad_(True)
    a_leaf = torch.tensor(alpha, requires_grad=True)
    grad_v, grad_a = torch.autograd.grad(
        loss_at(trainer, a_leaf * v_leaf + (1 - a_leaf) * w, data), (v_leaf, a_leaf))
    assert torch.allclose(update.upload["model"], w - LR * grad_at(trainer, w, data), atol=1e-6)
    assert torch.allclose(update.personal["model"], v - LR * grad_v, atol=1e-6)
    assert update.personal["alpha"] == pytest.approx(float(alpha - alpha_lr * grad_a), abs=1e-6)
    assert update.personal["alpha"] != alpha

    fixed = APFL(APFLParams(alpha=alpha, adaptive=False), blueprint.context())
    kept = fixed.local_update(client_round(trainer, data, seed=1, payload={"model": w},
                                           personal={"model": v, "alpha": alpha}))
    assert kept.personal["alpha"] == alpha
    deployed = method.deploy(client_round(trainer, data, payload={"model": w},
                                          personal=update.personal)).models
    a = update.personal["alpha"]
    assert torch.allclose(deployed["personal"], a * update.personal["model"] + (1 - a) * w)
    assert torch.equal(deployed["global"], w)


# ---- pFedMe --------------------------------------------------------------------------------------
def test_pfedme_solves_the_moreau_problem_then_steps_w_towards_theta(tiny):
    """One local round of K = 3 inner steps θ ← θ − p(∇f(θ) + λ(θ − w)) from θ = w, then eq. 8's
    w − ηλ(w − θ): the upload is w, the personal model θ."""
    blueprint, trainer, data, init, _ = tiny
    lam, personal_lr = 2.0, 0.1
    method = PFedMe(PFedMeParams(lam=lam, personal_lr=personal_lr, inner_steps=3,
                                 local_rounds=1), blueprint.context())
    client = client_round(trainer, data, seed=2, payload={"model": init}, personal=init)
    update = run_plan(method.plan(client), client)
    theta = init.clone()
    for _ in range(3):
        theta = theta - personal_lr * (grad_at(trainer, theta, data) + lam * (theta - init))
    assert torch.allclose(update.personal, theta, atol=1e-6)
    assert torch.allclose(update.upload["model"], init - LR * lam * (init - theta), atol=1e-6)


def test_pfedme_server_moves_by_beta_towards_the_mean_of_the_uploads(tiny):
    blueprint, _, _, init, other = tiny
    method = PFedMe(PFedMeParams(beta=2.0), blueprint.context())
    state = method.server_init(init)
    uploads = Uploads(np.array([0, 1]), torch.tensor([1.0, 3.0]),
                      sums={"model": {0: (other + 3 * (2 * other)).double()}},
                      weights={"model": {0: 4.0}})
    state, _ = method.aggregate(state, uploads, 1)
    mean = (other + 3 * 2 * other) / 4
    assert torch.allclose(state["model"], (1 - 2.0) * init + 2.0 * mean, atol=1e-6)


def test_pfedme_refuses_a_step_of_w_that_overshoots_theta():
    with pytest.raises(SpecError, match="method.params.lam"):
        validate(small_spec_dict(method={"name": "pfedme", "params": {"lam": 50.0}}))


# ---- Per-FedAvg ----------------------------------------------------------------------------------
def test_perfedavg_first_order_step_is_the_gradient_at_the_adapted_model(tiny):
    blueprint, trainer, data, init, _ = tiny
    alpha = 0.2
    method = PerFedAvg(PerFedAvgParams(alpha=alpha), blueprint.context())
    update = method.local_update(client_round(trainer, data, seed=4, payload={"model": init}))
    adapted = init - alpha * grad_at(trainer, init, data)
    assert torch.allclose(update.upload["model"], init - LR * grad_at(trainer, adapted, data),
                          atol=1e-6)


def test_perfedavg_hessian_free_step_approximates_the_maml_gradient(tiny):
    """β(I − α∇²f(w))∇f(w̃) with the exact Hessian-vector product (autograd), against eq. 9's
    finite difference; the first-order step differs from it by more than the approximation."""
    blueprint, trainer, data, init, _ = tiny
    alpha = 0.5
    method = PerFedAvg(PerFedAvgParams(alpha=alpha, variant="hf"), blueprint.context())
    update = method.local_update(client_round(trainer, data, seed=4, payload={"model": init}))
    leaf = init.clone().requires_grad_(True)
    inner = torch.autograd.grad(loss_at(trainer, leaf, data), leaf, create_graph=True)[0]
    outer = grad_at(trainer, init - alpha * inner.detach(), data)
    hessian_times = torch.autograd.grad(inner, leaf, grad_outputs=outer)[0]
    exact = init - LR * (outer - alpha * hessian_times)
    first_order = init - LR * outer
    gap = float((update.upload["model"] - exact).abs().max())
    assert gap < 1e-5
    assert float((first_order - exact).abs().max()) > 10 * gap


def test_perfedavg_deploys_the_model_after_one_step_on_training_data(tiny):
    blueprint, trainer, data, init, _ = tiny
    alpha = 0.2
    method = PerFedAvg(PerFedAvgParams(alpha=alpha), blueprint.context())
    models = method.deploy(client_round(trainer, data, seed=9, payload={"model": init})).models
    assert torch.allclose(models["adapted"], init - alpha * grad_at(trainer, init, data),
                          atol=1e-6)
    assert torch.equal(models["global"], init)


def test_perfedavg_hessian_free_variant_passes_the_contract_checks_that_run_its_loop():
    """The contract suite runs each registered name with its defaults (``fo``); the ``hf``
    loop's state must be as deterministic and as restorable."""
    check_method("perfedavg", params={"variant": "hf"},
                 checks=["same_seed_gives_identical_tables",
                         "checkpoint_and_restore_equals_an_uninterrupted_run"])
