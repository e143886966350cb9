"""Two-stage sweeps: search specs refused before anything starts, the objective, how points are
chosen and kept, ASHA's stops left to the trial, and one Optuna search with ASHA driven end to
end through a driver kill in each stage."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from ray import tune

from raylf import results
from raylf.sweep.search import (
    RecordedASHA,
    SearchStage,
    choose,
    objective_value,
    read_choices,
    stop_mark,
    write_choices,
)
from raylf.sweep.spec import SweepSpec, expand, searched_methods
from raylf.sweep.stages import GridStage
from tests.faults.helpers import attempts, complete_trials, kill_group, start_sweep, wait_for
from tests.test_sweep import run_sweep

BASE = {
    "dataset": {"name": "digits"},
    "scenario": {"name": "label_subset", "k": 2, "val_fraction": 0.2},
    "model": {"name": "mlp", "hidden": [16]},
    "method": {"name": "fedavg"},
    "federation": {"num_clients": 6, "participation": 0.5, "rounds": 3, "batch_size": 32},
    "eval_every": 1,
}
LR = {"federation.optimizer.lr": {"loguniform": [0.01, 0.3]}}


def sweep_dict(search: dict, name: str = "fedavg_se", **fields) -> dict:
    """A sweep of one searched method; a ``None`` in ``search`` leaves that field out."""
    search = {"algorithm": "random", "samples": 3, "space": LR, **search}
    return {"name": "s", "experiment": BASE, **fields, "methods": [
        {"name": name, "search": {k: v for k, v in search.items() if v is not None}}]}


def write(tmp_path: Path, sweep: dict) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


@pytest.mark.parametrize("search, fields, where, words", [
    ({"objective": "acc_mean"}, {}, "search.objective", ["not a validation metric",
                                                         "val_acc_mean"]),
    ({}, {"overrides": {"scenario.val_fraction": 0.0}}, "scenario.val_fraction",
     ["validation data", "set scenario.val_fraction"]),
    ({"space": {"federation.optimizer.lr": {"loguniform": [0, 1]}}}, {}, "space",
     ["loguniform: low must be > 0"]),
    ({"space": {"federation.optimizer.lr": {"normal": [0, 1]}}}, {}, "space",
     ["should be 'uniform', 'loguniform', 'choice', 'randint' or 'quniform'"]),
    ({"algorithm": "optuna", "samples": None}, {}, "search", ["needs samples"]),
    ({"space": {"method.params.mu": {"uniform": [-1, 1]}}}, {"_method": "fedprox"},
     "methods[0] (fedprox) search method.params.mu", ["greater than or equal to 0"]),
    ({"space": {"method.params.nope": {"choice": [1, 2]}}}, {}, "method.params.nope",
     ["unknown field"]),
    ({"scheduler": {"grace_rounds": 3}}, {}, "search.scheduler.grace_rounds",
     ["fewer than 3"]),
    ({"space": {"seed": {"randint": [0, 9]}}}, {}, "search", ["list the seeds in search_seeds"]),
    ({}, {"grid": {"federation.local_epochs": [1, 2]}}, "<root>", ["sweep-level grid"]),
])
def test_bad_search_specs_exit_2_naming_the_field_before_anything_starts(
        tmp_path, capsys, search, fields, where, words):
    from raylf.sweep.cli import main

    name = fields.pop("_method", "fedavg_se")
    spec = write(tmp_path, sweep_dict(search, name, **fields))
    assert main([str(spec), "--storage", str(tmp_path / "out"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert where in err and all(w in err for w in words), err
    assert not (tmp_path / "out").exists()


def test_a_missing_tracker_package_is_a_spec_error_naming_the_extra(tmp_path, capsys):
    import importlib.util

    from raylf.sweep.cli import main

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    spec = write(tmp_path, sweep_dict({}))
    assert main([str(spec), "--storage", str(tmp_path / "out"), "--log", "wandb",
                 "--dry-run"]) == 2
    assert "--log: wandb needs the wandb package; pip install 'raylf[wandb]'" in \
        capsys.readouterr().err


def test_objective_is_its_column_or_the_mean_over_the_reported_models_tasks():
    assert objective_value({"val_acc_mean": 0.5, "val_acc_mean_shared": 0.1},
                           "val_acc_mean") == 0.5
    multi = {"val_acc_mean_binary": 0.8, "val_acc_mean_multiclass": 0.4,
             "val_acc_mean_binary_own_heads": 0.0, "val_acc_mean_multiclass_own_heads": 0.0}
    assert objective_value(multi, "val_acc_mean") == pytest.approx(0.6)
    assert objective_value(multi, "val_acc_mean_binary") == 0.8
    assert objective_value({"round": 3, "acc_mean": 0.9}, "val_acc_mean") is None


def test_grid_trials_show_their_hyperparameters_by_dotted_name_in_the_tune_config():
    sweep = SweepSpec.model_validate({
        "name": "s", "experiment": BASE, "seeds": [0, 1],
        "methods": [{"name": "fedprox", "grid": {"method.params.mu": [0.0, 0.1]}},
                    {"name": "fedavg"}]})
    trials = expand(sweep)
    stage = GridStage(trials, "s", "/tmp/unused")
    space, tune_config = stage.tune_setup(2)
    assert tune_config["num_samples"] == len(trials) == 6
    assert set(space) == {"trial_id", "method", "seed", "method.params.mu"}
    shown = {c["trial_id"]: c for c in stage.tune_configs()}
    for trial in trials:
        assert shown[trial.trial_id] == {
            "trial_id": trial.trial_id, "method": trial.spec.method.name,
            "seed": trial.spec.seed, "method.params.mu": trial.point.get("method.params.mu")}


def test_a_grid_over_mappings_reaches_tune_as_json_that_tune_accepts():
    """A grid over whole sub-specs (tune/hdcfl_quick.yaml's scenarios): Tune merges a mapping
    in points_to_evaluate into the space's domain and raised TypeError before any trial ran."""
    scenarios = [{"name": "label_subset", "k": 2}, {"name": "rotation", "groups": 2}]
    sweep = SweepSpec.model_validate({"name": "s", "experiment": BASE,
                                      "grid": {"scenario": scenarios}})
    stage = GridStage(expand(sweep), "s", "/tmp/unused")
    space, tune_config = stage.tune_setup(2)
    tune_config["search_alg"].add_configurations(
        [tune.Experiment("s", run=lambda config: None, config=space, num_samples=2)])
    assert sorted(c["scenario"] for c in stage.tune_configs()) == sorted(
        json.dumps(s, sort_keys=True) for s in scenarios)


def _stage(tmp_path: Path, search: dict, search_seeds=(0, 1)) -> SearchStage:
    sweep = SweepSpec.model_validate(sweep_dict(search, search_seeds=list(search_seeds)))
    (searched,), _ = searched_methods(sweep)
    return SearchStage(searched, "s", str(tmp_path))


def _record(stage: SearchStage, trial, status: str, values: dict, last_round: int) -> None:
    row = {"trial_id": trial.trial_id, "status": status, "search": stage.searched.key, **values}
    meta = results.provenance({})
    results.write_table(stage.root, "rounds", trial.trial_id, results.to_table(
        [{"trial_id": trial.trial_id, "round": r} for r in range(1, last_round + 1)], meta))
    results.write_table(stage.root, "trials", trial.trial_id, results.to_table([row], meta))


@pytest.mark.parametrize("mode", ["max", "min"])
def test_choose_ranks_points_by_mean_over_search_seeds_never_a_stopped_one(tmp_path, mode):
    stage = _stage(tmp_path, {"objective": "val_eval_loss", "mode": mode,
                              "space": {"federation.optimizer.lr": {"choice": [0.01, 0.02,
                                                                               0.03, 0.04]}}})
    scores = {0.01: [("ok", 0.6), ("ok", 0.8)],        # mean 0.7
              0.02: [("ok", 0.95), ("stopped", 0.1)],  # best and worst seed, but stopped
              0.03: [("ok", 0.5), ("ok", 0.55)],       # mean 0.525
              0.04: [("ok", 0.9), ("diverged", None)]}
    trials = []
    for lr, outcomes in scores.items():
        for seed, (status, value) in zip(stage.searched.seeds, outcomes):
            trial = stage.trial({"federation.optimizer.lr": lr, "seed": seed})
            _record(stage, trial, status, {"val_eval_loss": value}, 1 if status == "stopped" else 3)
            trials.append(trial)
    choices = choose(stage, trials, top_k=2)
    expected = [(0.01, 0.7), (0.03, 0.525)] if mode == "max" else [(0.03, 0.525), (0.01, 0.7)]
    assert [(c.point["federation.optimizer.lr"], round(c.score, 6)) for c in choices] == expected
    assert [c.rank for c in choices] == [1, 2]
    first = choices[0]
    assert (first.points, first.budget, first.stopped, first.rounds_saved) == (4, 8, 1, 2)
    assert len(first.trials) == 2 and all(t in {x.trial_id for x in trials} for t in first.trials)
    assert read_choices(stage) is None  # not chosen until written
    write_choices(stage, choices)
    assert read_choices(stage) == choices


def test_a_search_where_nothing_qualifies_is_still_recorded_as_done(tmp_path):
    stage = _stage(tmp_path, {}, search_seeds=[0])
    trial = stage.trial({"federation.optimizer.lr": 0.05, "seed": 0})
    _record(stage, trial, "diverged", {"val_acc_mean": None}, 2)
    assert choose(stage, [trial], top_k=1) == []
    write_choices(stage, [])
    assert read_choices(stage) == []


class FakeTrial:
    def __init__(self, trial_id):
        self.trial_id = trial_id


def test_asha_leaves_its_stop_for_the_trial_to_carry_out(tmp_path):
    asha = RecordedASHA(str(tmp_path), time_attr="round", metric="val_acc_mean", mode="max",
                        max_t=8, grace_period=1, reduction_factor=2)
    good, bad = FakeTrial("good"), FakeTrial("bad")
    for trial in (good, bad):
        asha.on_trial_add(None, trial)
    assert asha.on_trial_result(None, good, {"round": 1, "val_acc_mean": 0.9}) == asha.CONTINUE
    assert asha.on_trial_result(None, bad, {"round": 1}) == asha.CONTINUE  # nothing to judge
    assert stop_mark(str(tmp_path), "bad") is None
    assert asha.on_trial_result(None, bad, {"round": 1, "val_acc_mean": 0.1}) == asha.CONTINUE
    assert stop_mark(str(tmp_path), "bad") == {"round": 1, "value": 0.1}
    assert stop_mark(str(tmp_path), "good") is None


def _selection(search_root: Path) -> list[dict]:
    files = sorted((search_root / "tables" / "selection").glob("*.parquet"))
    return [row for f in files for row in pq.read_table(f).to_pylist()]


@pytest.mark.slow
@pytest.mark.timeout(1200)  # three driver starts on a busy 2-core machine
def test_search_with_asha_survives_a_driver_kill_in_each_stage(tmp_path):
    """Optuna (TPE) over FedAvg-SE's lr with ASHA, then the chosen point over two seeds; the
    driver is SIGKILLed once a search trial has finished and again once a replicate has: no
    finished trial runs again and the replicates use the points chosen before the kill."""
    spec = write(tmp_path, sweep_dict(
        {"algorithm": "optuna", "scheduler": {"grace_rounds": 1, "reduction_factor": 2}},
        seeds=[1, 2], max_concurrent=1, checkpoint_every=1, checkpoint_min_s=0,
        resources={"workers": 1, "cpus_per_worker": 0.5}))
    storage = tmp_path / "out"
    root, search_root = storage / "s", storage / "s" / "search"
    log = ("--log", "tensorboard", "--log", "json")

    # 1. stage 1: a search trial has finished, the others have not
    driver = start_sweep(spec, storage, *log)
    wait_for(lambda: complete_trials(search_root), 300, "a search trial's tables", driver)
    kill_group(driver)
    searched_before = complete_trials(search_root)
    attempts_before = {t: attempts(search_root, t) for t in searched_before}
    assert len(searched_before) < 3 and not _selection(search_root)

    # 2. stage 2: the point is chosen and a replicate has finished, the other has not
    driver = start_sweep(spec, storage, *log)
    wait_for(lambda: _selection(search_root) and complete_trials(root), 400,
             "the chosen point and a replicate's tables", driver)
    kill_group(driver)
    chosen = _selection(search_root)
    replicated_before = complete_trials(root)
    attempts_before |= {t: attempts(root, t) for t in replicated_before}
    assert len(chosen) == 1 and len(replicated_before) == 1

    # 3. to the end
    proc = run_sweep(spec, storage, "--resume", *log)
    assert proc.returncode == 0, proc.stderr[-3000:]
    searched = results.load(search_root)["trials"]
    assert len(searched) == 3 and searched["trial_id"].is_unique  # the budget, nothing twice
    assert set(searched["status"]) <= {"ok", "stopped"}
    replicates = results.load(root)["trials"]
    assert len(replicates) == 2 and set(replicates["status"]) == {"ok"}
    counts = {**dict(zip(searched["trial_id"], searched["attempts"])),
              **dict(zip(replicates["trial_id"], replicates["attempts"]))}
    assert {t: counts[t] for t in attempts_before} == attempts_before  # not run again
    assert _selection(search_root) == chosen  # the same point after the resume
    (choice,) = chosen
    point = json.loads(choice["point"])
    assert (replicates["federation.optimizer.lr"] == point["federation.optimizer.lr"]).all()
    assert sorted(replicates["seed"]) == [1, 2]
    status = dict(zip(searched["trial_id"], searched["status"]))
    assert all(status[t] == "ok" for t in json.loads(choice["trials"]))  # never a stopped one
    stopped = searched[searched["status"] == "stopped"]["trial_id"]
    last = results.load(search_root)["rounds"].groupby("trial_id")["round"].max()
    assert choice["rounds_saved"] == sum(3 - last[t] for t in stopped)
    assert choice["stopped"] == len(stopped)
    assert re.search(rf"val_acc_mean {choice['score']:.4f} \(#1 of 3 points, 3 trials\)",
                     proc.stdout), proc.stdout
    for trial_id in replicates["trial_id"]:  # Tune's config names the hyperparameters
        config = json.loads((root / trial_id / "params.json").read_text())
        assert config["federation.optimizer.lr"] == point["federation.optimizer.lr"]
        assert config["method"] == "fedavg_se" and config["seed"] in (1, 2)
    experiment = search_root / choice["search"]
    for trial_id in searched["trial_id"]:
        config = json.loads((experiment / trial_id / "params.json").read_text())
        assert set(config) == {"method", "federation.optimizer.lr", "__trial_index__"}
        assert list(experiment.glob(f"{trial_id}/events.out.tfevents*"))  # --log tensorboard
