"""What a trial records of itself: its spec resolved (every default filled in, the method's
``Params`` included) and its environment, in the trials row and the Parquet metadata; the
``--diff`` that tells two results apart by them, including a default changed between runs."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from raylf import results
from raylf.config import validate
from raylf.experiment import run_experiment
from raylf.methods import METHODS
from raylf.methods.fedavg import FedProxParams
from raylf.report.__main__ import main
from raylf.sweep.spec import load_sweep
from tests.conftest import small_spec_dict

ROOT = Path(__file__).resolve().parents[1]
ENVIRONMENT = {"raylf", "git_sha", "git_dirty", "python", "torch", "ray", "numpy", "cuda",
               "device", "data_sha256", "partition_sha256"}


def _run(out: Path, **changes) -> dict:
    spec = validate(small_spec_dict(**{"method": {"name": "fedprox"}, "federation__rounds": 1,
                                       "eval_every": 1, **changes}))
    return run_experiment(spec, backend="local", out=str(out)).trial


def test_a_trial_records_every_default_and_its_environment(tmp_path):
    trial = _run(tmp_path)
    # fields the spec never set, at their defaults
    assert trial["method.params.mu"] == FedProxParams().mu
    assert trial["scenario.test_fraction"] == 0.25 and trial["scenario.val_fraction"] == 0.0
    assert trial["dataset.normalize"] == "standard"
    assert {k.removeprefix("env.") for k in trial if k.startswith("env.")} == ENVIRONMENT
    assert trial["env.device"].startswith(("cpu: ", "cuda: "))
    assert len(trial["env.data_sha256"]) == len(trial["env.partition_sha256"]) == 64
    meta = pq.read_schema(next((tmp_path / "tables" / "trials").glob("*.parquet"))).metadata
    config, env = json.loads(meta[b"config"]), json.loads(meta[b"environment"])
    assert config["method"]["params"] == {"mu": FedProxParams().mu}
    assert config["scenario"]["test_fraction"] == 0.25
    assert set(env) == ENVIRONMENT


def test_the_partition_digest_follows_the_seed(tmp_path):
    same = _run(tmp_path / "a"), _run(tmp_path / "b")
    other = _run(tmp_path / "c", seed=4)
    assert same[0]["env.partition_sha256"] == same[1]["env.partition_sha256"]
    assert other["env.partition_sha256"] != same[0]["env.partition_sha256"]
    assert other["env.data_sha256"] == same[0]["env.data_sha256"]


def test_every_quickstart_trial_records_every_parameter_default():
    """The quickstart's trials table (``ExperimentSpec.flat`` is its config columns) holds the
    test share and every parameter of each method, set or not."""
    _, trials = load_sweep(ROOT / "tune" / "quickstart.yaml")
    for trial in trials:
        columns = trial.spec.flat()
        assert "scenario.test_fraction" in columns and "scenario.val_fraction" in columns
        params = METHODS.get(trial.spec.method.name).Params.model_fields
        assert all(any(c == f"method.params.{p}" or c.startswith(f"method.params.{p}.")
                       for c in columns) for p in params), trial.spec.method.name


@pytest.fixture
def changed_default():
    """FedProx's ``mu`` default raised to 0.1 for the test (as a later version might), then
    put back."""
    field = FedProxParams.model_fields["mu"]
    before = field.default
    field.default = 0.1
    FedProxParams.model_rebuild(force=True)
    yield
    field.default = before
    FedProxParams.model_rebuild(force=True)


def _diff(capsys, *args) -> tuple[int, str]:
    code = main([*map(str, args), "--diff"])
    return code, capsys.readouterr().out


def test_a_default_changed_between_two_runs_is_named_by_the_diff(tmp_path, capsys,
                                                                  request):
    _run(tmp_path / "before")
    _run(tmp_path / "again")
    code, same = _diff(capsys, tmp_path / "before", tmp_path / "again")
    assert code == 0 and "the same experiment" in same and "not the same" not in same
    request.getfixturevalue("changed_default")
    _run(tmp_path / "after")
    code, out = _diff(capsys, tmp_path / "before", tmp_path / "after")
    assert code == 0
    assert "not the same experiment: the protocol differs in method.params.mu" in out
    assert "| method.params.mu | protocol | 0.01 | 0.1 |" in out


def test_a_diff_of_two_trials_of_one_directory(tmp_path, capsys):
    a = _run(tmp_path, seed=3)["trial_id"]
    b = _run(tmp_path, seed=4, federation__rounds=2)["trial_id"]
    code, out = _diff(capsys, f"{tmp_path}#{a}", f"{tmp_path}#{b}")
    assert code == 0 and "federation.rounds" in out and "| seed | replicates | 3 | 4 |" in out
    assert main([str(tmp_path), "--diff"]) == 2
    assert main([str(tmp_path), f"{tmp_path}#nosuchtrial", "--diff"]) == 2
    assert "no trials there with id 'nosuchtrial'" in capsys.readouterr().err


def test_storage_metadata_keeps_the_provenance_keys_readers_use(tmp_path):
    meta = results.provenance({"name": "x"})
    assert {"raylf", "ray", "torch", "git_sha", "config", "environment"} <= set(meta)


def test_a_parameter_that_is_text_in_one_trial_and_a_number_in_another_reads_as_text(tmp_path):
    """Resolved specs record every model parameter: an MLP's ``hidden`` widths (a list, JSON)
    and a CharLSTM's ``hidden`` width (a number) land in one column of a sweep's tables."""
    results.write_trial(tmp_path, "a", {"trials": [{"trial_id": "a", "model.hidden": "[64]"}]},
                        {})
    results.write_trial(tmp_path, "b", {"trials": [{"trial_id": "b", "model.hidden": 256}]}, {})
    trials = results.load(tmp_path)["trials"].set_index("trial_id")
    assert trials.at["a", "model.hidden"] == "[64]" and trials.at["b", "model.hidden"] == "256"
