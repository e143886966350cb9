"""DP calibration and accounting at the replace-one sensitivity 2·clip_norm (the FMT-SVM paper's
section 3.5, read as local DP)."""

import math

import pytest
import torch
from pydantic import ValidationError

from raylf.methods.privacy import (
    DPParams,
    achieved_epsilon,
    clip,
    composed_epsilon,
    gaussian_sigma,
    privatize,
    round_accounting,
)

DELTA = 1e-5


def test_analytic_sigma_matches_the_spec_and_achieves_the_requested_epsilon():
    dp = DPParams(epsilon=1.0, delta=DELTA)
    assert dp.calibration == "analytic" and dp.sensitivity == 2.0
    assert dp.sigma == pytest.approx(7.46, abs=0.01)
    # round trip: the accountant's exact ε for σ at sensitivity 2 is the ε asked for
    assert achieved_epsilon(dp.sigma / 2.0, DELTA) == pytest.approx(1.0, abs=1e-6)


def test_paper_sigma_is_the_classical_formula_and_overspends_at_the_true_sensitivity():
    dp = DPParams(epsilon=1.0, delta=DELTA, calibration="paper")
    assert dp.sigma == pytest.approx(math.sqrt(2 * math.log(1.25 / DELTA)))
    assert dp.sigma == pytest.approx(4.845, abs=0.01)
    assert achieved_epsilon(dp.noise_multiplier, DELTA) == pytest.approx(1.61, abs=0.01)


@pytest.mark.parametrize("calibration", ["analytic", "paper"])
def test_sigma_scales_linearly_with_clip_norm(calibration):
    base = gaussian_sigma(0.8, DELTA, 1.0, calibration)
    for clip_norm in (0.5, 3.0):
        assert gaussian_sigma(0.8, DELTA, clip_norm, calibration) == pytest.approx(
            clip_norm * base, rel=1e-9)
    # so what composes, σ over sensitivity, does not depend on clip_norm
    assert DPParams(epsilon=0.8, clip_norm=3.0, calibration=calibration).noise_multiplier == (
        pytest.approx(DPParams(epsilon=0.8, calibration=calibration).noise_multiplier))


def test_smaller_epsilon_needs_more_noise():
    assert gaussian_sigma(0.5, DELTA) > gaussian_sigma(1.0, DELTA) > gaussian_sigma(2.0, DELTA)


@pytest.mark.parametrize("calibration", ["analytic", "paper"])
def test_composed_epsilon_is_the_achieved_epsilon_for_one_round_and_then_grows(calibration):
    dp = DPParams(epsilon=1.0, calibration=calibration)
    eps = [round_accounting(dp, r)["dp_epsilon_composed"] for r in (1, 2, 10, 20)]
    assert all(a < b for a, b in zip(eps, eps[1:]))
    # PLD (discretised, pessimistic) agrees with the exact one-shot ε up to its tolerance
    achieved = achieved_epsilon(dp.noise_multiplier, dp.delta)
    assert eps[0] == pytest.approx(achieved, abs=1e-3)
    assert eps[0] >= achieved - 1e-9
    # sub-linear: below naive composition R·ε
    assert eps[0] < eps[-1] < 20 * achieved


def test_round_accounting_columns():
    report = round_accounting(DPParams(epsilon=1.0, clip_norm=0.5, calibration="paper"), rounds=3)
    assert set(report) == {"dp_epsilon_round", "dp_delta", "dp_sigma", "dp_sensitivity",
                           "dp_epsilon_achieved", "dp_epsilon_composed"}
    assert report["dp_epsilon_round"] == 1.0 and report["dp_delta"] == DELTA
    assert report["dp_sensitivity"] == 1.0
    assert report["dp_sigma"] == pytest.approx(0.5 * 4.845, abs=0.005)
    assert report["dp_epsilon_achieved"] == pytest.approx(1.61, abs=0.01)
    assert report["dp_epsilon_composed"] > report["dp_epsilon_achieved"]


def test_composed_epsilon_uses_the_noise_multiplier_at_true_sensitivity():
    dp = DPParams(epsilon=1.0, calibration="paper")
    at_true = composed_epsilon(dp.sigma / 2.0, DELTA, 5)
    assert round_accounting(dp, 5)["dp_epsilon_composed"] == at_true
    assert at_true > composed_epsilon(dp.sigma, DELTA, 5)  # the old, optimistic figure


def test_unknown_calibration_is_rejected():
    with pytest.raises(ValidationError, match="calibration"):
        DPParams(epsilon=1.0, calibration="classical")


def test_privatize_clips_to_clip_norm_and_is_reproducible_from_its_seed():
    v = torch.full((400,), 3.0)
    assert clip(v, 0.5).norm().item() == pytest.approx(0.5)
    short = torch.full((4,), 0.1)
    assert torch.equal(clip(short, 1.0), short)  # never scaled up
    dp = DPParams(epsilon=1.0, clip_norm=0.5)
    a, b = privatize(v, dp, seed=7), privatize(v, dp, seed=7)
    assert torch.equal(a, b) and not torch.equal(a, privatize(v, dp, seed=8))
    noise = a - clip(v, 0.5)  # zero-mean only if privatize clipped first
    assert noise.std().item() == pytest.approx(dp.sigma, rel=0.15)
    assert noise.mean().item() == pytest.approx(0.0, abs=4 * dp.sigma / math.sqrt(400))
