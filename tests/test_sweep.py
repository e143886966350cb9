"""The sweep service end to end: each test drives ``python -m raylf.sweep`` in its own process
(its own local Ray: 2 CPUs and a fake GPU), as a user would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from raylf import results

ROOT = Path(__file__).resolve().parents[1]

BASE = {
    "dataset": {"name": "digits"},
    "scenario": {"name": "label_subset", "k": 2},
    "model": {"name": "mlp", "hidden": [16]},
    "method": {"name": "fedavg"},
    "federation": {"num_clients": 6, "participation": 0.5, "rounds": 3, "batch_size": 32},
    "eval_every": 1,
}


def write_sweep(tmp_path: Path, **fields) -> Path:
    sweep = {"name": "t", "experiment": BASE, "seeds": [0], **fields}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


def sweep_cmd(spec: Path, storage: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "raylf.sweep", str(spec), "--storage", str(storage),
            "--num-cpus", "2", "--num-gpus", "1", *extra]


def env(**more) -> dict[str, str]:
    return {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT), **more}


def run_sweep(spec: Path, storage: Path, *extra: str, timeout: int = 600, **more):
    return subprocess.run(sweep_cmd(spec, storage, *extra), capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env(**more))


def test_grid_of_gpu_share_trials_completes_with_exact_rows(tmp_path):
    spec = write_sweep(
        tmp_path, seeds=[0, 1],
        methods=[{"name": "fedprox", "grid": {"method.params.mu": [0.0, 0.1],
                                              "federation.local_epochs": [1, 2]}}],
        resources={"workers": 2, "cpus_per_worker": 0.25, "gpus_per_worker": 0.25,
                   "coordinator_cpus": 0.25})
    proc = run_sweep(spec, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables = results.load(tmp_path / "out" / "t")
    assert len(tables["trials"]) == 8 and set(tables["trials"]["status"]) == {"ok"}
    assert len(tables["rounds"]) == 8 * 3
    assert len(tables["clients"]) == 8 * 3 * 6
    assert (tables["trials"]["resources.gpus_per_worker"] == 0.25).all()
    assert "leaderboard" in proc.stdout and "mu=0.1, local_epochs=2" in proc.stdout
    assert str(tmp_path / "out" / "t" / "tables" / "trials") in proc.stdout


def test_dry_run_counts_trials_and_plans_without_ray(tmp_path):
    spec = write_sweep(tmp_path, seeds=[0, 1, 2], grid={"federation.local_epochs": [1, 2]},
                       resources={"workers": 2, "cpus_per_worker": 0.5, "gpus_per_worker": 0.25})
    proc = run_sweep(spec, tmp_path / "out", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "6 trials"
    assert "bundles per trial: [{'CPU': 0.25}, {'CPU': 0.25}, {'CPU': 0.5, 'GPU': 0.25}, " \
           "{'CPU': 0.5, 'GPU': 0.25}]" in proc.stdout
    assert "1 trial(s) fit at once" in proc.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fields, field", [
    ({"grid": {"federation.rondes": [1, 2]}}, "federation.rondes"),
    ({"methods": [{"name": "fedsgd"}]}, "method.name"),
    ({"seeds": []}, "seeds"),
    ({"max_concurrent": 0}, "max_concurrent"),
])
def test_bad_sweep_exits_2_naming_the_field(tmp_path, fields, field):
    proc = run_sweep(write_sweep(tmp_path, **fields), tmp_path / "out")
    assert proc.returncode == 2
    assert field in proc.stderr
    assert "Started a local Ray" not in proc.stderr and not (tmp_path / "out").exists()


def test_killed_driver_resumes_without_rerunning_finished_trials(tmp_path):
    spec = write_sweep(tmp_path, seeds=[0, 1, 2, 3], max_concurrent=1, checkpoint_every=2,
                       overrides={"federation.rounds": 8},
                       resources={"workers": 1, "cpus_per_worker": 0.5})
    storage = tmp_path / "out"
    driver = subprocess.Popen(sweep_cmd(spec, storage), cwd=ROOT, env=env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    trials_dir = storage / "t" / "tables" / "trials"
    deadline = time.time() + 300
    while time.time() < deadline and len(list(trials_dir.glob("*.parquet"))) < 2:
        time.sleep(0.5)
    finished_before = {p.stem for p in trials_dir.glob("*.parquet")}
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    time.sleep(2)
    try:
        os.killpg(driver.pid, signal.SIGKILL)  # what the driver's own Ray left behind
    except ProcessLookupError:
        pass
    assert 2 <= len(finished_before) < 4, "the kill must land mid-sweep"

    proc = run_sweep(spec, storage, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming sweep" in proc.stdout
    trials = results.load(storage / "t")["trials"]
    assert sorted(trials["trial_id"]) == sorted(set(trials["trial_id"])) and len(trials) == 4
    assert set(trials["status"]) == {"ok"}
    attempts = dict(zip(trials["trial_id"], trials["attempts"]))
    assert all(attempts[t] == 1 for t in finished_before)  # not run again
    rounds = results.load(storage / "t")["rounds"]
    assert rounds.groupby("trial_id")["round"].apply(list).map(lambda r: r == list(
        range(1, 9))).all()


def test_failing_worker_is_retried_from_checkpoint_and_divergence_is_recorded(tmp_path):
    marker = tmp_path / "failed-once"
    spec = write_sweep(
        tmp_path, checkpoint_every=1, max_failures=1,
        overrides={"federation.rounds": 4},
        methods=[{"name": "faulty_once", "params": {"fail_round": 3, "marker": str(marker)}},
                 {"name": "fedavg", "grid": {"federation.optimizer.lr": [0.05, 1.0e6]}}],
        resources={"workers": 1, "cpus_per_worker": 0.5})
    proc = run_sweep(spec, tmp_path / "out", RAYLF_PLUGINS="tests.plugins.faulty")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert marker.exists()
    tables = results.load(tmp_path / "out" / "t")
    trials = tables["trials"].set_index("method", drop=False)
    faulty = trials.loc["faulty_once"]
    assert faulty["status"] == "ok" and faulty["attempts"] == 2
    rounds = tables["rounds"]
    assert list(rounds[rounds.trial_id == faulty["trial_id"]]["round"]) == [1, 2, 3, 4]
    fedavg = tables["trials"][tables["trials"].method == "fedavg"]
    by_lr = dict(zip(fedavg["federation.optimizer.lr"], fedavg["status"]))
    assert by_lr == {0.05: "ok", 1.0e6: "diverged"}
