"""FMT-SVM and its baselines: losses, Σ, bytes on the wire, DP, model shapes, an end-to-end run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raylf.config import SpecError, load_spec
from raylf.data import build_federation
from raylf.data.sources import SOURCES, load_source
from raylf.experiment import run_experiment
from raylf.methods.base import Uploads
from raylf.methods.fmtsvm import (
    FMTSVM,
    FedPureCNN,
    FedPureSVM,
    FMTSVMParams,
    covariance_penalty,
    penalty_prox,
    task_covariance,
)
from raylf.methods.multitask import SOFTMAX, SVM, TaskLoss, auc, binary_hinge, multiclass_hinge
from raylf.methods.privacy import DPParams, clip, composed_epsilon, gaussian_sigma, privatize
from raylf.runtime.blueprint import Blueprint

EXAMPLE = "tune/examples/digits_multitask_fmtsvm.yaml"


def example(*overrides: str):
    return load_spec(EXAMPLE, list(overrides))


def native(*overrides: str):
    """The example on native 8×8 digits: the same code paths, ~10× less compute per run."""
    return example("dataset.size=8", *overrides)


def test_binary_hinge_by_hand():
    score = torch.tensor([2.0, 0.5, -0.3, 0.2])
    y = torch.tensor([1, 1, 0, 0])  # read as +1, +1, −1, −1
    # max(0, 1−2)=0, max(0, 1−0.5)=0.5, max(0, 1−0.3)=0.7, max(0, 1+0.2)=1.2
    assert binary_hinge(score, y).item() == pytest.approx((0 + 0.5 + 0.7 + 1.2) / 4)


def test_multiclass_hinge_by_hand():
    s = torch.tensor([[3.0, 1.0, 2.5], [0.0, 0.2, -1.0]])
    y = torch.tensor([0, 2])
    # row 0 (y=0): max(0, 1+1−3)=0, max(0, 1+2.5−3)=0.5 → 0.5
    # row 1 (y=2): max(0, 1+0+1)=2, max(0, 1+0.2+1)=2.2 → 4.2
    assert multiclass_hinge(s, y).item() == pytest.approx((0.5 + 4.2) / 2)


def test_sigma_update_matches_the_formula():
    # N=2 heads, 1+C = 2 columns, d = 2; rows are head columns (W̃_k = w_kᵀ)
    w = torch.tensor([[[1.0, 1.0], [0.0, 2.0]],
                      [[3.0, 1.0], [2.0, 0.0]]])
    # W̄ = [[2, 1], [1, 1]]; Z_0 = −Z_1 = [[−1, 0], [−1, 1]]; Z_kᵀZ_k = [[1, 1], [1, 2]]
    expected = torch.tensor([[1.001, 1.0], [1.0, 2.001]])
    assert torch.allclose(task_covariance(w, 1e-3, normalize=False), expected)
    normalized = task_covariance(w, 1e-3, normalize=True)
    assert torch.allclose(normalized, expected * 2 / 3.002)


def test_identity_sigma_reduces_the_covariance_term_to_the_frobenius_norm():
    w = torch.randn(4, 7)
    assert covariance_penalty(w, torch.eye(4)).item() == pytest.approx(w.pow(2).sum().item())
    sigma = torch.diag(torch.tensor([1.0, 2.0, 4.0, 0.5]))
    by_formula = torch.trace(w.T @ torch.linalg.inv(sigma) @ w)  # tr(W̃Σ⁻¹W̃ᵀ), W̃ = wᵀ
    assert covariance_penalty(w, torch.linalg.inv(sigma)).item() == pytest.approx(
        by_formula.item(), rel=1e-5)


def test_auc_is_macro_one_vs_rest_and_null_on_one_class_splits():
    y = np.array([0, 1, 2, 2])
    perfect = np.eye(3)[y] * 2 - 1
    assert auc(y, perfect) == 1.0
    assert auc(np.array([1, 1, 1]), np.array([0.3, -0.2, 1.0])) is None
    assert auc(np.array([0, 1]), np.array([0.1, 0.9])) == 1.0


def test_upload_is_the_heads_only_through_a_real_local_round():
    spec = native("federation.rounds=1")
    rounds = run_experiment(spec, backend="local").tables["rounds"]
    d, c = 128, 3
    assert rounds[0]["bytes_up"] / rounds[0]["participants"] == (d + 1 + d * c + c) * 4 == 2064
    # download = the heads plus Σ (4×4 floats), nothing else
    assert rounds[0]["bytes_down"] / rounds[0]["participants"] == 2064 + 16 * 4


@pytest.mark.parametrize("method, width, encoder_params, last", [
    ("fmtsvm", 4, True, torch.nn.Linear), ("fed_pure_cnn", 5, True, torch.nn.ReLU),
    ("fed_pure_svm", 4, False, torch.nn.Flatten)])
def test_model_head_width_per_method(method, width, encoder_params, last):
    spec = example(f"method.name={method}")
    model = Blueprint(spec, build_federation(spec)).build_model()
    assert model.head.out_features == width
    pixels = spec.dataset_params.size ** 2
    assert model.head.in_features == (128 if encoder_params else pixels)  # raw pixels
    assert any(True for _ in model.encoder.parameters()) == encoder_params
    # the validated defaults: FMT-SVM's linear features (eq. 7), FedPureCNN's ReLU
    assert isinstance(list(model.encoder.modules())[-1], last)


@pytest.mark.parametrize("method", ["fmtsvm", "fed_pure_cnn"])
def test_encoder_features_are_linear_as_in_eq_7_unless_the_relu_is_asked_for(method):
    """z = W_f·flatten + b_f by default (signed features); feature_relu keeps the cnn's ReLU
    (non-negative features); the parameters, and so the layout and init, are the same."""
    x = torch.from_numpy(load_source("digits", SOURCES.get("digits").Params()).x[:64])
    models = {}
    for relu in (False, True):
        spec = native(f"method.name={method}", f"method.params.feature_relu={relu}")
        models[relu] = Blueprint(spec, build_federation(spec)).build_model()
    linear, relu = models[False].encoder, models[True].encoder
    assert isinstance(linear[-1], torch.nn.Linear) and isinstance(relu[-1], torch.nn.ReLU)
    assert [p.shape for p in linear.parameters()] == [p.shape for p in relu.parameters()]
    with torch.no_grad():
        z = linear(x)
        assert (z < 0).any() and torch.equal(relu(x), z.clamp(min=0))


def test_linear_features_on_an_encoder_without_a_final_relu_fail_clearly():
    spec = native("model={name: mlp, hidden: []}")
    with pytest.raises(SpecError, match="method.params.feature_relu: true"):
        Blueprint(spec, build_federation(spec)).build_model()


@pytest.mark.parametrize("name", ["digits", "digits_multitask"])
def test_digits_size_resizes_once_and_keeps_the_unit_range(name):
    params = SOURCES.get(name).Params
    native = load_source(name, params())
    big = load_source(name, params(size=28))
    assert native.x.shape[1:] == (1, 8, 8) and big.x.shape == (len(native.x), 1, 28, 28)
    assert big.x.dtype == np.float32 and big.x.flags["C_CONTIGUOUS"]
    assert big.x.min() >= 0.0 and big.x.max() <= 1.0
    assert big.x.max() > 0.9  # bright strokes survive bilinear upsampling
    # the same pictures: same mean ink, and pooled back to 8×8 they match the originals
    assert big.x.mean() == pytest.approx(native.x.mean(), rel=1e-3)
    pooled = torch.nn.functional.adaptive_avg_pool2d(torch.from_numpy(big.x), 8).numpy()
    assert np.corrcoef(pooled.ravel(), native.x.ravel())[0, 1] > 0.95
    assert np.array_equal(native.y, big.y) and native.tasks.keys() == big.tasks.keys()


def test_upload_ratio_against_fed_pure_cnn_at_native_and_mnist_size():
    def cnn_bytes(size: int) -> int:
        spec = example("method.name=fed_pure_cnn", f"dataset.size={size}")
        model = Blueprint(spec, build_federation(spec)).build_model()
        return 4 * sum(p.numel() for p in model.parameters())

    assert cnn_bytes(8) / 2064 < 100  # 8×8: the encoder flattens to only 32×2×2 = 128
    assert cnn_bytes(28) / 2064 > 100  # 28×28: flatten 32×7×7 = 1568, ~400× the heads


def loss_of(cls, kind, outputs, targets, **params):
    """The task loss ``cls`` builds from its params, on one minibatch."""
    return TaskLoss.of(kind, cls.Params(**params))(outputs, targets)


def test_reduction_defaults_to_per_sample_means_for_all_three_methods():
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    targets = {"binary": (y > 0).long(), "multiclass": y}
    for cls, kind, width in ((FMTSVM, SVM, 4), (FedPureSVM, SVM, 4), (FedPureCNN, SOFTMAX, 5)):
        assert cls.Params().reduction == "mean"
        outputs = torch.randn(6, width)
        summed = loss_of(cls, kind, outputs, targets, reduction="sum")
        assert summed.item() == pytest.approx(6 * loss_of(cls, kind, outputs, targets).item(),
                                              rel=1e-6)
    # C weighs the SVM hinges; with mean, each hinge is its per-sample mean
    outputs = torch.randn(6, 4)
    expected = 0.5 * (binary_hinge(outputs[:, 0], targets["binary"])
                      + multiclass_hinge(outputs[:, 1:], y))
    got = loss_of(FedPureSVM, SVM, outputs, targets, C=0.5)
    assert got.item() == pytest.approx(expected.item())


def test_fmtsvm_on_a_single_task_dataset_fails_clearly():
    spec = example("dataset.name=digits")
    with pytest.raises(SpecError, match="needs a multi-task dataset.*binary, multiclass"):
        run_experiment(spec, backend="local")


def digits_npz(path, multiclass, binary=lambda d: d >= 5, keep=lambda d: d >= 0) -> str:
    """Native 8×8 digits as an npz: ``y`` the digit, ``y_<task>`` functions of it."""
    digits = load_source("digits", SOURCES.get("digits").Params())
    rows = keep(digits.y)
    d = digits.y[rows]
    np.savez(path, x=digits.x[rows, 0], y=d, y_binary=binary(d).astype(np.int64),
             y_multiclass=multiclass(d).astype(np.int64))
    return str(path)


def npz_spec(path: str, *overrides: str):
    return example(f"dataset={{name: npz, path: {path}}}", *overrides)


@pytest.mark.parametrize("method, width", [
    ("fmtsvm", 1 + 3), ("fed_pure_cnn", 2 + 3), ("fed_pure_svm", 1 + 3)])
def test_heads_are_sized_from_the_multiclass_task_not_the_main_label(tmp_path, method, width):
    path = digits_npz(tmp_path / "mod3.npz", multiclass=lambda d: d % 3)  # y: 10 classes
    spec = npz_spec(path, f"method.name={method}")
    blueprint = Blueprint(spec, build_federation(spec))
    assert blueprint.federation.num_classes == 10
    assert blueprint.build_model().head.out_features == width
    if method == "fmtsvm":
        assert blueprint.method().server_init(blueprint.initial_vector())["sigma"].shape == (
            width, width)


def test_a_binary_task_with_more_than_two_labels_is_refused(tmp_path):
    path = digits_npz(tmp_path / "bad.npz", multiclass=lambda d: d % 3, binary=lambda d: d % 3)
    spec = npz_spec(path)
    with pytest.raises(SpecError, match="binary task needs labels 0/1.*y_binary"):
        run_experiment(spec, backend="local")


def test_ten_classes_one_absent_from_every_client_learn_with_a_regular_sigma(tmp_path):
    # y_multiclass = the digit with every 4 dropped: a 10-column head whose column 4 is never
    # a target, under Dirichlet 0.5 (issue 11: such columns kept FMT-SVM at chance)
    path = digits_npz(tmp_path / "no4.npz", multiclass=lambda d: d, keep=lambda d: d != 4)
    spec = npz_spec(path, "scenario.name=dirichlet", "federation.rounds=5")
    result = run_experiment(spec, backend="local")
    assert result.status == "ok", result.error
    assert result.trial["warning"] is None
    final = result.tables["rounds"][-1]
    for task in ("binary", "multiclass"):
        assert final[f"acc_mean_{task}"] > final[f"majority_rate_{task}"] + 0.15
    eigenvalues = [final[f"sigma_eig_{i}"] for i in range(1 + 10)]
    assert all(math.isfinite(e) for e in eigenvalues)
    assert min(eigenvalues) > 1e-2 * max(eigenvalues)  # measured: 0.04


def test_dp_sigma_follows_the_gaussian_mechanism():
    assert gaussian_sigma(1.0, 1e-5, calibration="paper") == pytest.approx(4.845, abs=1e-3)
    assert gaussian_sigma(0.8, 1e-5, calibration="paper") == pytest.approx(6.056, abs=1e-3)
    assert gaussian_sigma(1.0, 1e-5, clip_norm=2.0, calibration="paper") == pytest.approx(
        2 * 4.845, abs=2e-3)


def test_dp_clipping_bounds_the_norm_and_noise_is_seeded():
    v = torch.full((516,), 3.0)
    assert clip(v, 1.0).norm().item() == pytest.approx(1.0)
    short = torch.full((4,), 0.1)
    assert torch.equal(clip(short, 1.0), short)  # never scaled up
    dp = DPParams(epsilon=1.0)
    a, b = privatize(v, dp, seed=7), privatize(v, dp, seed=7)
    assert torch.equal(a, b) and not torch.equal(a, privatize(v, dp, seed=8))
    noise = a - clip(v, 1.0)
    assert noise.std().item() == pytest.approx(dp.sigma, rel=0.1)


def test_composed_epsilon_grows_with_rounds():
    dp = DPParams(epsilon=1.0)
    eps = [composed_epsilon(dp.noise_multiplier, 1e-5, r) for r in (1, 2, 10, 20)]
    assert all(a < b for a, b in zip(eps, eps[1:]))
    assert eps[0] <= 1.0 + 1e-6  # one round is at most the calibrated (ε, δ)


def test_dp_run_reports_per_round_and_composed_epsilon():
    # clipped: noise of ~5x the heads' norm blows up the paper's unbounded linear features
    spec = native("federation.rounds=2", "method.params.dp.epsilon=1.0",
                  "federation.optimizer.grad_clip=1.0")
    rounds = run_experiment(spec, backend="local").tables["rounds"]
    assert [r["dp_epsilon_round"] for r in rounds] == [1.0, 1.0]
    assert rounds[0]["dp_epsilon_composed"] < rounds[1]["dp_epsilon_composed"]
    assert rounds[0]["dp_sigma"] == pytest.approx(7.46, abs=0.01)


def test_dp_and_encoder_sync_together_are_rejected():
    with pytest.raises(ValueError, match="dp noises the heads only"):
        FMTSVMParams(dp={"epsilon": 1.0}, encoder_sync_every=2)


def test_penalty_prox_is_the_exact_minimizer_of_the_step_problem():
    torch.manual_seed(0)
    q = torch.linalg.qr(torch.randn(4, 4)).Q
    sigma_inv = torch.linalg.inv(q @ torch.diag(torch.tensor([2e-4, 0.4, 1.2, 2.4])) @ q.T)
    anchor, v = torch.randn(4, 6), torch.randn(4, 6)
    lam, mu, lr = 1.0, 0.01, 0.01
    shrink, pull = penalty_prox(sigma_inv, anchor, lam, mu, lr)
    w = shrink @ v + pull
    # stationarity of ½‖W − V‖² + η(λ tr(WΣ⁻¹Wᵀ) + μ‖W − A‖²)
    grad = (w - v) + lr * (2 * lam * sigma_inv @ w + 2 * mu * (w - anchor))
    assert grad.abs().max().item() < 1e-4


def test_penalty_gradient_steps_blow_up_where_proximal_steps_settle():
    # Σ as measured after round 1 at 28×28 (smallest eigenvalue 2e-4): η·2λ/eig_min = 10 > 2
    sigma_inv = torch.diag(1 / torch.tensor([2e-4, 0.04, 0.12, 3.8]))
    anchor = torch.randn(4, 8)
    lam, mu, lr = 0.1, 0.01, 0.01
    w_grad = w_prox = anchor.clone()
    shrink, pull = penalty_prox(sigma_inv, anchor, lam, mu, lr)
    for _ in range(20):
        w_grad = w_grad - lr * (2 * lam * sigma_inv @ w_grad + 2 * mu * (w_grad - anchor))
        w_prox = shrink @ w_prox + pull
    assert w_grad.norm() > 1e10 * anchor.norm()
    assert w_prox.norm() < anchor.norm()


def test_server_averages_heads_by_samples_and_reports_sigma_eigenvalues():
    spec = example()
    method = Blueprint(spec, build_federation(spec)).method()
    heads = torch.randn(3, 516)
    n = torch.tensor([1.0, 1.0, 2.0])
    state, diag = method.aggregate({}, Uploads(np.arange(3), n, {"heads": heads}), rnd=1)
    assert torch.allclose(state["heads"], (heads[0] + heads[1] + 2 * heads[2]) / 4, atol=1e-6)
    eig = [diag[f"sigma_eig_{i}"] for i in range(4)]
    assert sum(eig) == pytest.approx(4.0, rel=1e-5)  # trace-normalized


def test_encoder_sync_uploads_and_broadcasts_the_encoder_on_schedule():
    spec = native("federation.rounds=2", "method.params.encoder_sync_every=2")
    rounds = run_experiment(spec, backend="local").tables["rounds"]
    assert rounds[0]["bytes_up"] == 5 * 2064
    assert rounds[1]["bytes_up"] > 5 * 2064  # round 2 uploads encoders too


@pytest.mark.slow
def test_example_spec_learns_both_tasks_end_to_end():
    # the example's defaults (mean hinges, lr 0.05, E 5, R 10, standardized 8×8 digits), chosen
    # on validation data; the thresholds are far below what it reaches and far above chance
    result = run_experiment(native(), backend="local")
    assert result.status == "ok", result.error
    final = result.tables["rounds"][-1]
    for task in ("binary", "multiclass"):
        assert final[f"acc_mean_{task}"] > 0.8  # measured (seed 0): 0.89 / 0.96
        assert final[f"auc_mean_{task}"] > 0.85  # 0.91 / 0.98


def test_baselines_run_on_the_same_spec():
    for method in ("fed_pure_cnn", "fed_pure_svm"):
        spec = native(f"method.name={method}", "federation.rounds=1")
        result = run_experiment(spec, backend="local")
        assert result.status == "ok", result.error
        rows = result.tables["clients"]
        assert {r["task"] for r in rows} == {"binary", "multiclass"}
        assert all(math.isfinite(r["loss"]) for r in rows)
