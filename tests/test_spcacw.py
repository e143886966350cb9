"""SP-CACW and its reference rules: the simplex solver, the smoothness estimate, the server's
bookkeeping on hand-made gradients, the per-step runtime's primitives, and a short run."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from raylf.config import SpecError, validate
from raylf.experiment import run_experiment
from raylf.methods.base import MethodContext, Uploads
from raylf.methods.perstep import epoch_batch
from raylf.methods.simplex import minimize_on_simplex, objective, objective_grad, project_simplex
from raylf.methods.spcacw import (
    SPCACW,
    SelfishLocal,
    SelfishOracle,
    SelfishUniform,
    SPCACWParams,
    smoothness,
    trace_variance,
)
from raylf.models import SplitModel
from raylf.schema import OptimizerSpec
from raylf.training.layout import ParamLayout, model_vector
from raylf.training.sequential import LocalTrainer
from tests.conftest import small_spec_dict


def tiny_model(inputs: int = 4, hidden: int = 3, classes: int = 3) -> SplitModel:
    torch.manual_seed(0)
    return SplitModel(nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh()),
                      nn.Linear(hidden, classes))


def trainer_of(model: SplitModel, **optimizer) -> LocalTrainer:
    return LocalTrainer(model, ParamLayout.of(model), OptimizerSpec(**optimizer), 8, 1,
                        torch.device("cpu"))


def context(model: SplitModel, clients: int, groups=None) -> MethodContext:
    return MethodContext(ParamLayout.of(model), clients, np.full(clients, 16), 3, 10, clients,
                         0, None if groups is None else np.asarray(groups))


# ---- the simplex solver ------------------------------------------------------------------------
def test_projection_onto_the_simplex():
    assert np.allclose(project_simplex(np.array([0.2, 0.3, 0.5])), [0.2, 0.3, 0.5])
    assert np.allclose(project_simplex(np.array([2.0, 0.0, 0.0])), [1, 0, 0])
    assert np.allclose(project_simplex(np.array([1.0, 1.0, -3.0])), [0.5, 0.5, 0])
    rng = np.random.default_rng(0)
    for _ in range(50):
        v = rng.normal(size=6) * 3
        a = project_simplex(v)
        assert a.min() >= 0 and a.sum() == pytest.approx(1)
        # the closest point of a convex set: (v − a)·(z − a) ≤ 0 for every vertex z
        assert ((v - a) @ (np.eye(6) - a).T).max() <= 1e-12


def test_objective_gradient_matches_finite_differences():
    rng = np.random.default_rng(1)
    b = rng.normal(size=(5, 5))
    q, lam, alpha = b @ b.T + 0.3 * np.triu(b), 0.7, rng.dirichlet(np.ones(5))
    eps = 1e-6
    numeric = [(objective(alpha + eps * e, q, lam) - objective(alpha - eps * e, q, lam))
               / (2 * eps) for e in np.eye(5)]
    assert np.allclose(objective_grad(alpha, q, lam), numeric, rtol=1e-6, atol=1e-8)


def test_pgd_reaches_the_minimizer():
    # min Σ q_i α_i² on the simplex: α_i ∝ 1/q_i
    q = np.diag([1.0, 2.0, 4.0])
    sol = minimize_on_simplex(q, 0.0, np.array([1.0, 0, 0]), tol=1e-12, max_iter=100_000)
    assert sol.converged
    assert np.allclose(sol.alpha, np.array([4, 2, 1]) / 7, atol=1e-8)
    # a term linear on the simplex, (1ᵀα)(dᵀα) = dᵀα, penalizes peer 2 (a large bias): the
    # solution is sparse, α = (½, ½, 0)
    d = np.array([0.0, 0.0, 5.0])
    q = 0.5 * np.eye(3) + (np.outer(np.ones(3), d) + np.outer(d, np.ones(3))) / 2
    sol = minimize_on_simplex(q, 0.1, np.full(3, 1 / 3), tol=1e-12, max_iter=100_000)
    assert sol.converged and sol.alpha[2] == 0
    assert np.allclose(sol.alpha, [0.5, 0.5, 0], atol=1e-8)
    # both problems at once (targets updating in the same step): each stops on its own
    both = minimize_on_simplex(np.stack([np.diag([1.0, 2.0, 4.0]), q]), np.array([0.0, 0.1]),
                               np.array([[1.0, 0, 0], [1 / 3, 1 / 3, 1 / 3]]), tol=1e-12,
                               max_iter=100_000)
    assert both.converged.all() and both.iterations[1] == sol.iterations
    assert np.allclose(both.alpha, [[4 / 7, 2 / 7, 1 / 7], [0.5, 0.5, 0]], atol=1e-8)


# ---- smoothness, variance, optimizer step ------------------------------------------------------
def test_hvp_power_iteration_matches_the_explicit_hessian():
    model = tiny_model()
    trainer = trainer_of(model)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    w0 = trainer.vector()
    layout = trainer.layout

    def loss(w):
        params = {s.name: w[s.offset: s.offset + s.numel].view(s.shape) for s in layout.slots}
        return nn.functional.cross_entropy(torch.func.functional_call(model, params, (x,)), y)

    hessian = torch.autograd.functional.hessian(loss, w0)
    exact = float(torch.linalg.eigvalsh(hessian).abs().max())
    estimate = smoothness(trainer, x, y, 300, torch.Generator().manual_seed(0))
    assert estimate == pytest.approx(exact, rel=1e-3)
    assert torch.equal(trainer.vector(), w0)  # nothing left changed


def test_trace_variance_is_the_sum_of_per_coordinate_variances():
    g = torch.randn(6, 5, dtype=torch.float64)
    total, squares = g.sum(0), (g * g).sum(0)
    var = g.var(0)
    assert float(trace_variance(total, squares, 6, "trace")) == pytest.approx(float(var.sum()))
    assert float(trace_variance(total, squares, 6, "var_norm_sq")) == pytest.approx(
        float((var ** 2).sum()))
    assert float(trace_variance(total, squares, 1, "trace")) == 0


def test_a_learner_steps_as_torch_sgd_with_clipping_bit_for_bit():
    """The per-step runtime's step is the trainers' (``raylf.training.sgd.step_``):
    clip_grad_norm_ then ``torch.optim.SGD.step`` on the parameter tensors, exactly."""
    model = tiny_model()
    cfg = OptimizerSpec(lr=0.1, momentum=0.9, weight_decay=0.01, grad_clip=0.5)
    method = SelfishLocal(SelfishLocal.Params(), context(model, 3))
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01)
    w = torch.cat([p.detach().reshape(-1) for p in params]).clone()
    m = torch.zeros_like(w)
    for step in range(3):
        g = torch.randn_like(w) * (step + 1)
        w, m = method.step(w, m, g, cfg)
        offset = 0
        for p in params:
            p.grad = g[offset: offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
    assert torch.equal(w, torch.cat([p.detach().reshape(-1) for p in params]))


def test_epoch_batches_visit_every_sample_once_per_epoch():
    n, b = 23, 5  # 5 steps per epoch, the last one short
    first = torch.cat([epoch_batch(n, b, s, 0, 2) for s in range(1, 6)])
    second = torch.cat([epoch_batch(n, b, s, 0, 2) for s in range(6, 11)])
    assert sorted(first.tolist()) == list(range(n)) == sorted(second.tolist())
    assert not torch.equal(first, second)  # reshuffled each epoch


def test_gradients_at_equals_a_loop_of_gradient_calls():
    for model in (tiny_model(),
                  SplitModel(nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.BatchNorm2d(2),
                                           nn.ReLU(), nn.Flatten()), nn.Linear(2 * 3 * 4, 3))):
        trainer = trainer_of(model)
        x = torch.randn(6, 4) if isinstance(model.encoder[0], nn.Linear) else \
            torch.randn(6, 1, 3, 4)
        y = torch.randint(0, 3, (6,))
        loaded = trainer.vector()
        weights = loaded + 0.3 * torch.randn(4, loaded.numel())
        stacked = trainer.gradients_at(weights, x, y)
        assert torch.equal(trainer.vector(), loaded)  # buffers untouched
        assert len(trainer.fits) == 1 and trainer.fits[0].steps == 0
        loop = []
        for w in weights:
            trainer.load(w)
            loop.append(trainer.gradient(x, y))
        assert torch.allclose(stacked, torch.stack(loop), atol=1e-6)


# ---- the server's bookkeeping --------------------------------------------------------------
def test_bias_ema_gram_matrices_and_direction():
    model = tiny_model()
    ctx = context(model, 3)
    method = SPCACW(SPCACWParams(targets=[0, 2], beta=0.25), ctx)
    p = ctx.layout.size
    state = method.server_init(model_vector(model, ctx.layout))
    g1, g2 = torch.randn(3, 2, p), torch.randn(3, 2, p)  # (client, target, P)
    state, d1, _ = method.directions(state, g1, 1)
    state, _, _ = method.directions(state, g2, 2)
    for k, t in enumerate((0, 2)):
        b1 = 0.25 * (g1[:, k] - g1[t, k])
        b2 = 0.75 * b1 + 0.25 * (g2[:, k] - g2[t, k])
        assert torch.allclose(state["bias"][k], b2, atol=1e-6)
        assert state["bias"][k][t].abs().max() == 0  # b̂ of the target itself stays 0
        gram = b1 @ b1.T + b2 @ b2.T
        assert torch.allclose(state["gram_b"][k].float(), gram, atol=1e-5)
        grams_g = g1[:, k] @ g1[:, k].T + g2[:, k] @ g2[:, k].T
        assert torch.allclose(state["gram_g"][k].float(), grams_g, atol=1e-5)
        assert torch.allclose(d1[k], g1[:, k].mean(0), atol=1e-6)  # α starts uniform
    assert state["steps"].tolist() == [2, 2]


def test_alpha_update_after_an_epoch_drops_a_biased_peer():
    model = tiny_model()
    ctx = context(model, 3)
    method = SPCACW(SPCACWParams(targets=[0]), ctx)
    p = ctx.layout.size
    state = method.server_init(model_vector(model, ctx.layout))
    shared, far = torch.randn(p), 10 * torch.randn(p)
    for step in range(1, 5):  # peer 1 agrees with the target, peer 2 is another cluster
        noise = 0.1 * torch.randn(3, p)
        grads = torch.stack([shared, shared, shared + far]) + noise
        state, _, _ = method.directions(state, grads[:, None], step)
    uploads = Uploads(np.arange(3), torch.full((3,), 16.0),
                      tensors={"smoothness": torch.tensor([[2.0, 0.1]])},
                      senders={"smoothness": np.array([0])})
    state, diagnostics = method.after_reports(state, uploads, 4)
    alpha = state["alpha"][0]
    assert alpha[2] == 0 and alpha.sum().item() == pytest.approx(1)
    assert diagnostics["alpha_support"] == 2 and diagnostics["L"] == 2.0
    assert diagnostics["lam_reg"] > 0
    assert state["steps"][0] == 0 and state["gram_b"][0].abs().max() == 0  # reset
    rows = method.tables(state, 4)["alpha"]
    assert [(r["target"], r["peer"]) for r in rows] == [(0, 0), (0, 1), (0, 2)]
    assert method.tables(state, 5) == {}


def test_fixed_rules():
    model = tiny_model()
    groups = [0, 1, 0, 1]
    ctx = context(model, 4, groups)
    init = model_vector(model, ctx.layout)
    oracle = SelfishOracle(SelfishOracle.Params(), ctx).server_init(init)["alpha"]
    assert torch.equal(oracle, torch.tensor([[.5, 0, .5, 0], [0, .5, 0, .5]] * 2).double())
    local = SelfishLocal(SelfishLocal.Params(targets=[1, 3]), ctx)
    state = local.server_init(init)
    grads = torch.randn(4, 2, ctx.layout.size)
    _, directions, _ = local.directions(state, grads, 1)
    assert torch.equal(directions, torch.stack([grads[1, 0], grads[3, 1]]))
    uniform = SelfishUniform(SelfishUniform.Params(), ctx).server_init(init)["alpha"]
    assert torch.equal(uniform, torch.full((4, 4), 0.25, dtype=torch.float64))


def test_spec_errors():
    with pytest.raises(SpecError, match="latent group labels"):
        validate(small_spec_dict(method__name="selfish_oracle", scenario={"name": "iid"}))
    with pytest.raises(SpecError, match="method.params.targets"):
        validate(small_spec_dict(method={"name": "spcacw", "params": {"targets": [0, 9]}}))


# ---- a short run -------------------------------------------------------------------------------
def test_spcacw_learns_weights_on_the_targets_cluster():
    """7 clients in 3 label-permuted clusters; target 0 shares its labels with clients 3 and 6.
    Twelve passes over its data: α already leans on its own cluster."""
    spec = validate(small_spec_dict(
        method={"name": "spcacw", "params": {"targets": [0]}},
        scenario={"name": "label_permutation", "clusters": 3},
        federation={"num_clients": 7, "rounds": 84, "batch_size": 32,
                    "optimizer": {"lr": 0.05, "momentum": 0.9, "grad_clip": 1.0}},
        eval_every=84, resources={"workers": 1}))
    result = run_experiment(spec)
    assert result.trial["status"] == "ok", result.trial["error"]
    alpha = pd.DataFrame(result.tables["alpha"])
    last = alpha[alpha["update"] == alpha["update"].max()].set_index("peer")["alpha"]
    assert last[[0, 3, 6]].sum() > 0.6
    assert [r["client_id"] for r in result.tables["clients"] if r["split"] == "test"] == [0]
    updates = [r for r in result.tables["rounds"] if "alpha_support" in r]
    assert len(updates) == alpha["update"].max()  # every update is in the rounds table
    assert sum(k.startswith("alpha_") for k in updates[-1]) == 7 + 1  # α_0..α_6, support
