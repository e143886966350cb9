"""Runs that say when they are not learning: dead ReLU units, accuracy at the majority rate."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from raylf.data.federation import Split
from raylf.experiment import run_experiment
from raylf.learning_check import (
    STUCK_ROUNDS,
    dead_relu_fraction,
    majority_columns,
    majority_rate,
    not_learning,
)
from raylf.models import MODELS, build_model
from raylf.schema import OptimizerSpec
from raylf.training.cohort import CohortTrainer
from raylf.training.layout import ParamLayout
from raylf.training.sequential import LocalTrainer


def test_dead_units_are_those_zero_on_every_probe_sample():
    dense = nn.Linear(2, 4)
    with torch.no_grad():
        dense.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]]))
        dense.bias.zero_()
    encoder = nn.Sequential(dense, nn.ReLU())
    positive = torch.rand(8, 2) + 0.1  # units 2 and 3 see only negative inputs
    assert dead_relu_fraction(encoder, positive) == 0.5
    assert dead_relu_fraction(encoder, torch.cat([positive, -positive])) == 0.0
    assert dead_relu_fraction(nn.Flatten(), positive) is None  # no ReLU: no diagnostic


def test_convolutional_units_are_channels_and_the_probe_changes_nothing():
    conv = nn.Conv2d(1, 3, 1)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([1.0, -1.0, 2.0]).view(3, 1, 1, 1))
        conv.bias.zero_()
    encoder = nn.Sequential(conv, nn.BatchNorm2d(3, affine=False), nn.ReLU()).train()
    encoder[1].running_mean.zero_()  # eval mode: the running statistics (0, 1) apply
    before = [t.clone() for t in encoder.state_dict().values()]
    assert dead_relu_fraction(encoder, torch.rand(4, 1, 5, 5) + 0.1) == pytest.approx(1 / 3)
    assert encoder.training
    assert all(torch.equal(a, b) for a, b in zip(before, encoder.state_dict().values()))


def test_majority_rate_and_its_round_columns():
    assert majority_rate(torch.tensor([2, 2, 0, 2])) == 0.75
    assert majority_rate(torch.tensor([], dtype=torch.long)) is None
    rows = [{"split": "test", "deployable": "main", "task": "main", "accuracy": 0.5,
             "majority_rate": 0.6},
            {"split": "test", "deployable": "main", "task": "main", "accuracy": 0.5,
             "majority_rate": 0.8},
            {"split": "val", "deployable": "main", "task": "main", "accuracy": 0.5,
             "majority_rate": 0.1},
            {"split": "test", "deployable": "main", "task": "binary", "accuracy": None,
             "majority_rate": None}]
    assert majority_columns(rows, "main") == {"majority_rate": pytest.approx(0.7)}


def evaluation(rnd: int, binary: float, multiclass: float) -> dict:
    return {"round": rnd, "acc_mean_binary": binary, "acc_mean_multiclass": multiclass,
            "majority_rate_binary": 0.6, "majority_rate_multiclass": 0.5,
            "dead_relu_fraction": 0.9}


def test_warning_after_three_stuck_evaluation_rounds_in_a_row():
    assert STUCK_ROUNDS == 3
    training_only = {"round": 2, "loss": 1.0}  # rounds without evaluation do not break a streak
    stuck = [evaluation(1, 0.6, 0.5), training_only, evaluation(3, 0.55, 0.505),
             evaluation(5, 0.6, 0.4)]
    warning = not_learning(stuck)
    assert warning is not None and "evaluation rounds 1, 3, 5" in warning
    assert "binary 0.600 vs 0.600" in warning and "dead ReLU units in the encoders: 90%" in warning
    # one task above its majority rate breaks the streak; two stuck rounds are not enough
    broken = [evaluation(1, 0.6, 0.5), evaluation(2, 0.6, 0.7), evaluation(3, 0.6, 0.5),
              evaluation(4, 0.6, 0.5)]
    assert not_learning(broken) is None
    assert not_learning([evaluation(1, 0.9, 0.9)] * 5) is None


def test_a_cohort_probes_each_client_as_its_own_model_would_be_probed():
    model = build_model("cnn", MODELS.get("cnn").Params(channels=[4, 8], features=6),
                        (3, 8, 8), 3)
    trainer = LocalTrainer(model, ParamLayout.of(model), OptimizerSpec(), 16, 1,
                           torch.device("cpu"))
    sizes = [40, 5, 0, 32]  # more than the probe, fewer (rows repeat), none, exactly the probe
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    x = torch.randn(int(offsets[-1]), 3, 8, 8)
    split = Split(x, torch.zeros(len(x), dtype=torch.long), {}, offsets)
    generator = torch.Generator().manual_seed(0)
    vectors = torch.stack([trainer.vector() + torch.randn(trainer.layout.size, generator=generator)
                           * scale for scale in (0.0, 0.3, 0.3, 1.0)])
    batched = CohortTrainer(trainer).dead_relu_fractions(vectors, split, [0, 1, 2, 3])
    one_by_one = []
    for position, vector in enumerate(vectors):
        trainer.load(vector)
        rows = split.rows(position)
        one_by_one.append(dead_relu_fraction(trainer.model.encoder, x[rows][:32]))
    assert batched == one_by_one
    assert batched[2] is None and len(set(batched)) > 2  # the clients' models really differ


def test_random_labels_give_a_warning_and_the_rounds_carry_the_diagnostics(tmp_path, small_spec):
    digits = load_digits()
    labels = np.random.default_rng(0).integers(0, 10, len(digits.target))  # nothing to learn
    path = tmp_path / "noise.npz"
    np.savez(path, x=digits.images.astype(np.float32) / 16, y=labels)
    spec = small_spec(dataset={"name": "npz", "path": str(path)}, eval_every=1,
                      method__name="fedavg", scenario={"name": "iid"},
                      resources__workers=1)
    result = run_experiment(spec)
    assert result.status == "ok", result.error
    assert result.trial["warning"].startswith("not learning")
    for record in result.tables["rounds"]:
        assert 0 <= record["dead_relu_fraction"] <= 1
        assert record["acc_mean"] <= record["majority_rate"] + 0.01
    assert all(0 < r["majority_rate"] <= 1 for r in result.tables["clients"])


def test_cohort_and_sequential_training_probe_the_same_units_on_evaluation_rounds(small_spec):
    """Rounds 2 and 3 of 3 evaluate (eval_every 2, and the last); round 1 is not probed."""
    dead = {}
    for cohort in ("auto", "off"):
        spec = small_spec(resources__cohort=cohort, resources__workers=1,
                          federation__rounds=3, eval_every=2)
        dead[cohort] = [r.get("dead_relu_fraction") for r in
                        run_experiment(spec).tables["rounds"]]
        assert dead[cohort][0] is None and None not in dead[cohort][1:], dead[cohort]
    assert dead["auto"][1:] == pytest.approx(dead["off"][1:], abs=1e-6)
