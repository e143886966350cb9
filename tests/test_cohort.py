"""Cohort training gives every client the result the sequential path gives it."""

from __future__ import annotations

import logging

import pytest
import torch

from raylf.config import validate
from raylf.data import build_federation
from raylf.runtime import Blueprint
from raylf.runtime.local import LocalRuntime
from raylf.testing import check_method
from tests.conftest import small_spec_dict

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


def test_a_batchnorm_model_trains_one_client_after_another_and_says_why(caplog):
    with caplog.at_level(logging.WARNING, logger="raylf"):
        rt = runtime("fedavg", "auto", model={"name": "resnet18"},
                     dataset={"name": "synthetic", "n_samples": 64, "n_features": 12})
    assert rt.coordinator.pool.shards[0].cohort is None
    assert "BatchNorm" in caplog.text and "one after another" in caplog.text


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
