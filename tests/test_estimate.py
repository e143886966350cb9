"""Cost estimates (``raylf.sweep --estimate``): which configurations a timing budget times, the
real-size stand-ins it reads where data are missing, and the printed estimate of a real run."""

from __future__ import annotations

import re

import pytest

from raylf.config import SpecError
from raylf.data import standin
from raylf.sweep import estimate
from raylf.sweep.smoke import configuration
from tests.test_sweep import ROOT, run_sweep

MAIN = ROOT / "tune" / "hdcfl_main.yaml"


def main_trials():
    from raylf.sweep.spec import load_sweep

    return load_sweep(MAIN)[1]


@pytest.mark.parametrize("budget, timed", [(None, 70), (70, 70), (18, 18), (17, 9), (9, 9)])
def test_a_budget_shares_timing_trials_by_the_finest_key_that_fits(budget, timed):
    """hdcfl_main's 70 configurations are 9 methods × 2 datasets × their scenarios: a budget
    of 18 shares a timing trial between scenarios only, one of 9 between datasets too; every
    configuration is costed by a timing trial of its own method, model and federation."""
    trials = main_trials()
    run = estimate.timing_run(trials, budget=budget, standins=False)
    assert len(run.trials) == timed and len(run.timed) == 70
    assert len(run.borrowed) == 70 - timed
    by_id = {t.trial_id: t.spec for t in run.trials}
    for trial in trials:
        timing = by_id[run.timed[configuration(trial.spec)]]
        assert (timing.method, timing.model, timing.resources) == \
            (trial.spec.method, trial.spec.model, trial.spec.resources)
        assert timing.federation.rounds == 5  # a tenth of 50
        if timed == 18:
            assert timing.dataset == trial.spec.dataset
    assert bool(run.borrowed) == any("marked ~" in note for note in run.notes)


def test_a_budget_below_the_methods_is_refused():
    with pytest.raises(SpecError, match="--estimate-budget: 8 timing trial.*give at least 9"):
        estimate.timing_run(main_trials(), budget=8, standins=False)


def test_device_hours_count_what_a_trial_holds_its_bundles():
    """A trial holds its bundles: the trial function's quarter CPU, the coordinator's and the
    workers'; one that trains its one worker in its own process has no coordinator to count."""
    spec = main_trials()[0].spec
    two = spec.model_copy(update={"resources": spec.resources.model_copy(update={
        "workers": 2, "cpus_per_worker": 1.5, "gpus_per_worker": 0.5, "coordinator_cpus": 2.0})})
    one = two.model_copy(update={"resources": two.resources.model_copy(update={"workers": 1})})
    assert (estimate.held(two, "CPU"), estimate.held(two, "GPU")) == (0.25 + 2.0 + 3.0, 1.0)
    assert (estimate.held(one, "CPU"), estimate.held(one, "GPU")) == (0.25 + 1.5, 0.5)


def test_the_estimate_times_stand_ins_of_the_real_size(tmp_path, monkeypatch):
    """Without CIFAR and the ImageNet weights, the timing trials read CIFAR's stand-in at the
    real size (50,000 training images: a round costs what it would on the real data) and
    stand-in weights, and the notes say so."""
    monkeypatch.setenv("RAYLF_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    written = []
    monkeypatch.setattr(standin, "write", lambda name, root, size: written.append((name, size)))
    run = estimate.timing_run(main_trials(), budget=9)
    assert set(written) == {("cifar10", "full")}  # (the fake writes nothing: asked each time)
    spec = run.trials[0].spec
    assert spec.dataset_params.root == str(standin.standin_root() / "full")
    assert "standin" in spec.model_params.weights
    assert any(note.startswith("cifar10 is not fetched") for note in run.notes)
    assert standin.SIZES["full"].per_class["cifar10"] == (5000, 1000)  # CIFAR-10's own counts


@pytest.mark.slow
def test_an_estimate_with_a_budget_prints_every_configuration(tmp_path):
    """hdcfl_quick (18 configurations: 9 methods × 2 scenarios) with a budget of 9: 9 timing
    trials run, the estimate lists all 18, the 9 untimed marked ~ and costed as the timed
    configuration of their method, and sums device and wall time."""
    proc = run_sweep(ROOT / "tune" / "hdcfl_quick.yaml", tmp_path / "out", "--estimate",
                     "--estimate-budget", "9", "--set", "seeds=[0]", "--num-cpus", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "9 of 18 configurations are not timed (--estimate-budget 9)" in out
    rows = re.findall(r"^ ([ ~])hdcfl_quick · (\w+)\(.*?\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)$",
                      out, re.M)
    assert len(rows) == 18 and sum(mark == "~" for mark, *_ in rows) == 9
    per_method: dict[str, set] = {}
    for _, method, _, *costs in rows:
        per_method.setdefault(method, set()).add(tuple(costs))
    assert len(per_method) == 9 and all(len(costs) == 1 for costs in per_method.values())
    assert re.search(r"^total: 18 trials, [\d.]+ GPU-hours, [\d.]+ CPU-hours", out, re.M)
    assert re.search(r"^wall .*2 trial\(s\) at once → \d", out, re.M)
