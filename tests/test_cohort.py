"""Cohort training gives every client the result the sequential path gives it."""

from __future__ import annotations

import logging
from contextlib import contextmanager

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from raylf.config import validate
from raylf.data import build_federation
from raylf.data.federation import Split
from raylf.models import MODELS, build_model
from raylf.models.base import ModelParams, SplitModel
from raylf.runtime import Blueprint
from raylf.runtime.local import LocalRuntime
from raylf.schema import OptimizerSpec
from raylf.testing import check_method, cohort_training_equals_the_sequential_path
from raylf.training.cohort import CohortMember, CohortTrainer
from raylf.training.layout import PARTS, ParamLayout, model_vector
from raylf.training.sequential import LocalTrainer
from tests.conftest import small_spec_dict
from tests.test_method_contract import SHORTER

TOLERANCE = 1e-5  # float rounding of batched kernels; nothing else may differ


def runtime(method: str, cohort, **changes) -> LocalRuntime:
    settings = {"scenario": {"name": "dirichlet", "alpha": 0.5}} | changes  # uneven sizes
    spec = small_spec_dict(
        method__name=method, resources__cohort=cohort, resources__workers=1,
        federation__local_epochs=2, federation__batch_size=16,
        federation__optimizer={"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4,
                               "grad_clip": 1.0}, **settings)
    spec = validate(spec)
    return LocalRuntime(Blueprint(spec, build_federation(spec)))


def trained(rt: LocalRuntime, rounds: int = 2):
    outcomes = [rt.run_round(r) for r in range(1, rounds + 1)]
    personal = {c: s for shard in rt.coordinator.pool.shards for c, s in shard.personal.items()}
    return outcomes, rt.coordinator.state, personal


def assert_close(a, b):
    if torch.is_tensor(a):
        assert torch.allclose(a, b, atol=TOLERANCE, rtol=0), float((a - b).abs().max())
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_close(a[k], b[k])


@pytest.mark.parametrize("method", ["fedavg", "fedprox", "fedavg_se", "local", "ditto", "fedsoft"])
def test_cohorts_match_the_sequential_path(method):
    cohort = runtime(method, "auto")
    assert cohort.coordinator.pool.shards[0].cohort is not None
    (c_out, c_state, c_personal) = trained(cohort)
    (s_out, s_state, s_personal) = trained(runtime(method, "off"))
    assert cohort.coordinator.pool.shards[0].cohort is not None  # it stayed on
    assert_close(c_state, s_state)
    assert_close(c_personal, s_personal)
    for a, b in zip(c_out, s_out):
        assert a.record["loss"] == pytest.approx(b.record["loss"], abs=TOLERANCE)
        assert [r["client_id"] for r in a.clients] == [r["client_id"] for r in b.clients]


def test_cohorts_of_a_fixed_size_split_the_participants_and_agree():
    (_, whole, _), (_, split, _) = trained(runtime("fedavg", "auto")), \
        trained(runtime("fedavg", 3))
    assert_close(whole, split)


def test_multitask_plans_run_in_cohorts():
    spec = {"dataset": {"name": "digits_multitask"},
            "scenario": {"name": "multitask_dirichlet", "alpha": 0.5}}
    cohort = runtime("fed_pure_cnn", "auto", **spec)
    c_state = trained(cohort)[1]
    assert cohort.coordinator.pool.shards[0].cohort is not None
    assert_close(c_state, trained(runtime("fed_pure_cnn", "off", **spec))[1])


def test_penalties_in_the_loss_train_in_cohorts_as_alone():
    """FMT-SVM's λ/μ terms stepped in the loss (``penalty``) rather than by its proximal map
    (``after_step``, its default, which the contract suite checks)."""
    check_method("fmtsvm", params={"penalty_step": "gradient"},
                 checks=["cohort_training_equals_the_sequential_path"])


def test_auto_keeps_a_batchnorm_encoder_sequential_on_the_cpu_for_its_convolutions_alone(caplog):
    """BatchNorm and dropout no longer keep a model out of cohorts: a tiny VGG16-CIFAR trains
    one client at a time under ``auto`` on a CPU because of its convolutions (the log says so),
    and in cohorts when forced."""
    vgg = {"model": {"name": "vgg16_cifar", "width": 1 / 16, "hidden": 16},
           "dataset": {"name": "digits", "size": 32}}
    with caplog.at_level(logging.WARNING, logger="raylf"):
        assert runtime("fedavg", "auto", **vgg).coordinator.pool.shards[0].cohort is None
    assert "convolutions" in caplog.text
    assert "BatchNorm" not in caplog.text and "dropout" not in caplog.text
    assert runtime("fedavg", 3, **vgg).coordinator.pool.shards[0].cohort is not None


def test_methods_with_their_own_update_keep_the_sequential_path():
    assert runtime("ifca", "auto").coordinator.pool.shards[0].cohort is None


def test_auto_keeps_convolution_heavy_models_sequential_on_the_cpu_unless_forced():
    big = {"model": {"name": "cnn"}, "dataset": {"name": "digits", "size": 28}}
    assert runtime("fedavg", "auto", **big).coordinator.pool.shards[0].cohort is None
    assert runtime("fedavg", 4, **big).coordinator.pool.shards[0].cohort is not None
    small = {"model": {"name": "cnn"}}  # 8×8 digits: cheap convolutions, cohorts pay
    assert runtime("fedavg", "auto", **small).coordinator.pool.shards[0].cohort is not None


def test_personal_models_are_evaluated_in_cohorts_with_the_sequential_scores():
    changes = {"scenario": {"name": "dirichlet", "alpha": 0.5, "val_fraction": 0.1}}
    cohort, plain = runtime("fedavg_se", "auto", **changes), runtime("fedavg_se", "off", **changes)
    for rt in (cohort, plain):
        rt.run_round(1)
    rows = [rt.coordinator.evaluate(1) for rt in (cohort, plain)]
    assert [(r["split"], r["client_id"], r["n_test"], r["correct"]) for r in rows[0]] == \
           [(r["split"], r["client_id"], r["n_test"], r["correct"]) for r in rows[1]]
    assert [r["loss"] for r in rows[0]] == pytest.approx([r["loss"] for r in rows[1]], abs=1e-5)



def test_cohort_sizing_probes_no_model_without_convolutions():
    """``cohort: auto`` weighs convolution work; a character LSTM (token ids in, no
    convolution) is not fed a float probe it cannot embed (the smoke run of
    spcacw_shakespeare.yaml found FedAMP and FedDisco workers dying on it)."""
    from raylf.models.paper import CharLSTM
    from raylf.training.cohort import not_worthwhile

    net = CharLSTM.build(CharLSTM.Params(embedding=8, hidden=8, layers=1), (50,), 80)
    assert not_worthwhile(net, (50,), torch.device("cpu")) is None


# ---- per-client BatchNorm and dropout --------------------------------------------------------
ENCODERS = [  # the papers' BatchNorm encoders, tiny: model, params, input, trained parts
    pytest.param("vgg16_cifar", {"width": 1 / 16, "hidden": 16}, (1, 32, 32), PARTS,
                 id="vgg16_cifar"),  # layer by layer (BatchedLayers), dropout after every conv
    pytest.param("vgg16_cifar", {"width": 1 / 16, "hidden": 16}, (1, 32, 32), ("head",),
                 id="vgg16_cifar-head-only"),  # the frozen encoder's statistics move all the same
    pytest.param("resnet18", {}, (1, 8, 8), PARTS, id="resnet18"),  # vmap, residual blocks
    pytest.param("mobilenet_v2", {"width_mult": 0.1}, (3, 8, 8), PARTS,
                 id="mobilenet_v2"),  # vmap, dropout, channels-last convolutions on a CPU
]
EXACT = 1e-9  # float64: rounding is ~1e-16, so a larger gap is a difference of arithmetic


@contextmanager
def double_precision():
    """Build and train in float64. Deep BatchNorm stacks on minibatches of a few samples
    amplify float32 rounding by orders of magnitude within one local update, on the sequential
    path as much as in cohorts (FedAvg with this VGG16 on 32×32 digits, its vector perturbed by
    a relative 1e-7 before every local update, moved by 2e-2 in the first round), so float32
    could not tell a wrong statistic from rounding; float64 can."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@pytest.fixture
def one_torch_thread():
    """One torch thread, as a Ray worker of one CPU trains: these models' many small kernels
    under two threads on a busy 2-core machine spent 20-70× longer waiting on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name, params, shape, trainable", ENCODERS)
def test_batchnorm_encoders_train_and_evaluate_in_cohorts_as_one_at_a_time(
        one_torch_thread, name, params, shape, trainable):
    """Two clients of uneven sizes (batches of 4: the second step is the first client's alone,
    on a short batch), each from its own running statistics, with a proximal pull and, for one
    of them, a loss term against a reference model (run in eval mode on the reference's own
    statistics): every trained vector — parameters and running statistics — and every loss
    equal one client at a time's, and so do the models' outputs in eval mode."""
    with double_precision():
        torch.manual_seed(0)
        model = build_model(name, MODELS.get(name).Params(**params), shape, 5)
        layout = ParamLayout.of(model)
        optimizer = OptimizerSpec(lr=0.05, momentum=0.9, weight_decay=1e-3, grad_clip=1.0)
        trainer = LocalTrainer(model, layout, optimizer, 4, 1, torch.device("cpu"))
        init = model_vector(trainer.model, layout).double()
        sizes = [6, 4]
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        split = Split(torch.randn(offsets[-1], *shape), torch.randint(0, 5, (offsets[-1],)),
                      {}, offsets)
        statistics = torch.cat([torch.arange(s.offset, s.offset + s.numel)
                                for s in layout.slots if not s.is_param])
        starts = []
        for _ in sizes:  # the same weights, each client's running statistics its own
            start = init.clone()
            start[statistics] += 0.1 * torch.rand(len(statistics))
            starts.append(start)

        def towards_reference(batch):
            return (batch.outputs - batch.references["global"].outputs).pow(2).mean()

        members = [CohortMember(c, start, seed=100 + c, anchor=init, mu=0.1,
                                terms=(towards_reference,) if c == 0 else (),
                                references={"global": init})
                   for c, start in enumerate(starts)]
        cohort = CohortTrainer(trainer)
        vectors, fits = cohort.fit(members, split, "labels", trainable=trainable,
                                   loss_fn=F.cross_entropy)
        outputs = cohort.predict(vectors, torch.stack([split.x[:8]] * len(sizes)))
        for c, member in enumerate(members):
            rows = split.rows(c)
            trainer.load(member.start)
            alone = trainer.fit(split.x[rows], split.y[rows], seed=member.seed,
                                trainable=trainable, prox=(member.anchor, member.mu),
                                terms=member.terms, references=member.references)
            assert (fits[c].steps, fits[c].samples) == (alone.steps, alone.samples)
            assert fits[c].loss == pytest.approx(alone.loss, abs=EXACT)
            gap = float((vectors[c] - trainer.vector()).abs().max())
            assert gap <= EXACT, f"client {c}'s trained vector differs by {gap:.1e}"
            moved = (vectors[c, statistics] - member.start[statistics]).abs().max()
            assert moved > 1e-3  # its running statistics followed its own batches
            eval_gap = float((outputs[c] - trainer.predict(split.x[:8])).abs().max())
            assert eval_gap <= EXACT, f"client {c}'s eval-mode outputs differ by {eval_gap:.1e}"


class NormalizedCNN:
    """One block of VGG16-CIFAR's pattern (convolution → BatchNorm → ReLU → 2D dropout →
    max-pool) and its classifier's (linear → BatchNorm → ReLU → dropout 0.5): every layer whose
    statistics and masks are per client, in a model whose training keeps float32 rounding at
    rounding over the contract check's four rounds. Deep BatchNorm stacks over minibatches of a
    few samples amplify it on both paths alike (the paper encoders: checked above in float64),
    and so do some shallow ones: perturbed by a relative 1e-8 before every local update, FedAvg
    with this model moved by 1e-6 after four rounds, with 16 channels, 64 features and dropout
    0.2 by 2e-2."""

    class Params(ModelParams):
        channels: int = 8
        features: int = 16
        dropout: float = 0.5
        residual: bool = Field(False, description="a residual block after the first (ResNet's "
                                                  "pattern): trained under vmap, not layer by "
                                                  "layer")

    @staticmethod
    def build(params: Params, input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
        channels, (_, height, width) = params.channels, input_shape
        block = [Residual(nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1),
                                        nn.BatchNorm2d(channels)))] if params.residual else []
        encoder = nn.Sequential(
            nn.Conv2d(input_shape[0], channels, 3, padding=1), nn.BatchNorm2d(channels),
            nn.ReLU(), *block, nn.Dropout2d(params.dropout), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(channels * (height // 2) * (width // 2), params.features),
            nn.BatchNorm1d(params.features), nn.ReLU(), nn.Dropout(params.dropout))
        return SplitModel(encoder, nn.Linear(params.features, num_classes))


class Residual(nn.Module):
    def __init__(self, body: nn.Module):
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


@pytest.fixture
def normalized_cnn():
    with MODELS.temporarily("normalized_cnn", NormalizedCNN):
        yield {"name": "normalized_cnn"}


@pytest.mark.parametrize("method, variant", [
    pytest.param("fedavg", {}, id="fedavg"), pytest.param("ditto", {}, id="ditto"),
    pytest.param("hdcfl", {}, id="hdcfl"),
    pytest.param("hdcfl", {"residual": True}, id="hdcfl-residual")])
def test_batchnorm_and_dropout_pass_the_contracts_cohort_check(one_torch_thread, normalized_cnn,
                                                               method, variant):
    """The contract's cohort check on a model with BatchNorm and dropout: the server's averaged
    running statistics (FedAvg), personal models with their own over two fits (Ditto),
    encoders with their statistics averaged into prototypes beside private heads (HDC-FL), and
    every client's scores in eval mode, in cohorts as one client at a time; layer by layer, and
    under vmap for a model with a residual block (its clients' personal models scored in
    batches under vmap too)."""
    cohort_training_equals_the_sequential_path(method, SHORTER.get(method),
                                               model={**normalized_cnn, **variant})


class CumulativeCNN(NormalizedCNN):
    """NormalizedCNN whose first BatchNorm averages over every batch it has seen (momentum
    None)."""

    @staticmethod
    def build(params, input_shape, num_classes):
        model = NormalizedCNN.build(params, input_shape, num_classes)
        model.encoder[1].momentum = None
        return model


def test_a_cumulative_batchnorm_average_trains_one_client_after_another_and_says_why(caplog):
    """BatchNorm with momentum None averages over the batches the worker's model has counted,
    a count its clients share on the sequential path: no client's own copy reproduces it."""
    with MODELS.temporarily("cumulative_cnn", CumulativeCNN), \
            caplog.at_level(logging.WARNING, logger="raylf"):
        rt = runtime("fedavg", 3, model={"name": "cumulative_cnn"})
    assert rt.coordinator.pool.shards[0].cohort is None
    assert "momentum None" in caplog.text and "one after another" in caplog.text
