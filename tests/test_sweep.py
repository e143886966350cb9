"""The sweep service end to end: each test drives ``python -m raylf.sweep`` in its own process
(its own local Ray: 2 CPUs and a fake GPU), as a user would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from raylf import results
from raylf.config import validate
from raylf.experiment import run_experiment
from raylf.sweep.trial import ReportGate

ROOT = Path(__file__).resolve().parents[1]
MEASURED = re.compile(r".*(_s|_mb)$")  # seconds and memory: measured, not computed

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
        tmp_path, overrides={"federation.rounds": 4, "eval_every": 2}, report_min_s=1e6,
        methods=[{"name": "fedprox", "grid": {"method.params.mu": [0.0, 0.1],
                                              "federation.local_epochs": [1, 2]}}],
        resources={"workers": 2, "cpus_per_worker": 0.25, "gpus_per_worker": 0.25,
                   "coordinator_cpus": 0.25})
    proc = run_sweep(spec, tmp_path / "out", "--dashboard", "--log", "json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables = results.load(tmp_path / "out" / "t")
    assert len(tables["trials"]) == 4 and set(tables["trials"]["status"]) == {"ok"}
    lines = proc.stdout.splitlines()
    assert lines[0] == "sweep t: 4 trials (4 method/grid points × 1 seed)"
    assert re.search(r"^dashboard: http://127\.0\.0\.1:\d+$", proc.stdout, re.M)
    assert sum(line.startswith("[") and "] ok " in line for line in lines) == 4
    assert "\x1b[" not in proc.stdout + proc.stderr  # a plain log: no colour codes
    assert "WARNING" not in proc.stderr, proc.stderr
    assert len(tables["rounds"]) == 4 * 4  # every round in the tables
    assert len(tables["clients"]) == 4 * 2 * 6  # evaluated in rounds 2 and 4
    for trial_id in tables["trials"]["trial_id"]:  # Tune got the first round and the end:
        # report_min_s holds back the rest, evaluation round 2 too, which nothing shows (Tune's
        # JSON record, --log json, shows no round)
        lines = (tmp_path / "out" / "t" / trial_id / "result.json").read_text().splitlines()
        assert [json.loads(line)["round"] for line in lines] == [1, 4]
    assert (tables["trials"]["resources.gpus_per_worker"] == 0.25).all()
    assert "leaderboard" in proc.stdout and "mu=0.1, local_epochs=2" in proc.stdout
    assert f"tables: {tmp_path / 'out' / 't' / 'tables'}/{{trials,rounds,clients,leaderboard}}/" \
        in proc.stdout


@pytest.mark.slow
def test_trials_that_ended_for_good_leave_no_checkpoint_but_the_final_states_kept(tmp_path):
    """Every trial checkpoints while it runs. Once the sweep is done, a trial that ended for
    good has neither a personal state nor a file in Tune's checkpoints left; HDC-FL's, whose
    method keep_final_states lists, keeps its final personal states, which the donor-swap study
    reads; and a trial that failed keeps its checkpoint, which a rerun resumes from."""
    from raylf import diagnostics

    rounds = BASE["federation"]["rounds"]
    spec = write_sweep(
        tmp_path, checkpoint_every=1, checkpoint_min_s=0, max_failures=0,
        overrides={"federation.participation": 1.0}, keep_final_states=["hdcfl"],
        methods=[{"name": "hdcfl", "params": {"groups": 2}}, {"name": "fedavg_se"},
                 {"name": "faulty_once",
                  "params": {"fail_round": rounds, "marker": str(tmp_path / "failures")}}],
        resources={"workers": 1, "cpus_per_worker": 0.5})
    proc = run_sweep(spec, tmp_path / "out", "--log", "json", RAYLF_PLUGINS="tests.plugins.faulty")
    assert proc.returncode == 1, proc.stderr[-3000:]  # the faulty trial failed for good
    root = tmp_path / "out" / "t"
    trials = results.load(root)["trials"].set_index("method")
    ids = trials["trial_id"].to_dict()
    assert trials["status"].to_dict() == {"hdcfl": "ok", "fedavg_se": "ok",
                                          "faulty_once": "failed"}

    def reported(trial_id: str) -> list[str]:
        """The Tune checkpoints a trial reported, from Tune's own log of its results."""
        lines = (root / trial_id / "result.json").read_text().splitlines()
        return [name for line in lines if (name := json.loads(line)["checkpoint_dir_name"])]

    for method in ("hdcfl", "fedavg_se"):
        assert reported(ids[method])
        assert list((root / ids[method]).glob("checkpoint_*"))
        assert not list((root / ids[method]).glob("checkpoint_*/*"))
    assert not (root / "checkpoints" / ids["fedavg_se"]).exists()
    kept = root / "checkpoints" / ids["hdcfl"]
    assert [p.name for p in kept.iterdir()] == [f"round-{rounds}"]
    assert list((kept / f"round-{rounds}").glob("worker-*.pt"))
    assert diagnostics.main(["donor-swap", str(root)]) == 0
    swapped = results.load(root)["donor_swap"]
    assert set(swapped["trial_id"]) == {ids["hdcfl"]}

    # one worker: each trial trained in its trial function's own process, with the numbers the
    # in-process backend gives the same spec
    assert set(trials["backend"]) == {"inline"}
    swept = results.load(root)["clients"]
    swept = swept[swept["trial_id"] == ids["fedavg_se"]].reset_index(drop=True)
    config = pq.read_schema(root / "tables" / "clients" / f"{ids['fedavg_se']}.parquet").metadata
    local = run_experiment(validate(json.loads(config[b"config"])), backend="local")
    local = results.to_table(local.tables["clients"], {}).to_pandas()
    same = [c for c in local.columns if c not in ("trial_id", "loss") and not MEASURED.match(c)]
    assert len(swept) > 0 and swept[same].equals(local[same])
    # the evaluation loss is a float sum whose order follows the process's torch threads (one
    # in the trial, the test's own here): equal up to rounding, as the README promises it
    assert np.allclose(swept["loss"], local["loss"], rtol=1e-6, atol=0)

    failed = sorted((root / ids["faulty_once"]).glob("checkpoint_*"))
    assert [p.name for p in failed] == reported(ids["faulty_once"])[-len(failed):]
    assert (failed[-1] / "state.pt").is_file()
    progress = json.loads((failed[-1] / "progress.json").read_text())
    assert progress["next_round"] == rounds  # where a rerun resumes: the round that failed


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


def test_plugins_reach_the_workers_of_a_joined_cluster(ray_cluster, tmp_path):
    """A second driver joins the session's cluster with RAYLF_PLUGINS set only in its own
    environment (run from a folder where the plugin is not importable): a task on the cluster
    imports the plugin and finds its method."""
    script = (
        "import ray\n"
        "from raylf.raycluster import connect\n"
        "connect(None, None, 0)\n"
        "@ray.remote(num_cpus=0.1)\n"
        "def registered():\n"
        "    from raylf.methods import METHODS\n"
        "    from raylf.plugins import load_plugins\n"
        "    load_plugins()\n"
        "    return 'faulty_once' in METHODS\n"
        "print('plugin on worker:', ray.get(registered.remote(), timeout=120))\n")
    address = ray_cluster.get_runtime_context().gcs_address
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAYLF_PLUGINS")}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
        cwd=tmp_path, env={**clean, "RAY_ADDRESS": address, "RAY_AUTH_MODE": "disabled",
                           "RAYLF_PLUGINS": "tests.plugins.faulty",
                           "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "plugin on worker: True" in proc.stdout


def test_trial_metrics_accept_a_round_record(ray_cluster):
    @ray_cluster.remote(num_cpus=0.1)
    def record_rounds():
        from raylf.sweep.trial import TrialMetrics

        metrics = TrialMetrics("t", "t-fedavg-s0-0123456789", "fedavg")
        metrics.record({"round": 1, "bytes_up": 10, "bytes_down": 0, "loss": 0.5})
        metrics.record({"round": 2, "bytes_up": 10, "bytes_down": 12, "acc_mean": 0.5,
                        "acc_worst": 0.25, "acc_mean_binary": 0.75})
        return True

    assert ray_cluster.get(record_rounds.remote(), timeout=120)


class FakeTrial:
    """What the console reads of a Tune trial: ids, config, and the driver's copy of the
    error of a failed attempt (``error_file``)."""

    def __init__(self, trial_id, folder):
        self.trial_id = f"tune-{trial_id}"
        self.config = {"trial_id": trial_id}
        self.error_file = str(folder / f"{trial_id}-error.txt")
        Path(self.error_file).write_text("Traceback …\nRuntimeError: boom")


@pytest.mark.parametrize("tty", [False, True])
def test_console_prints_a_line_per_finished_trial_and_colours_only_terminals(tmp_path, tty):
    import io

    from raylf.experiment import run_experiment
    from raylf.sweep.console import SweepConsole
    from raylf.sweep.spec import load_sweep
    from raylf.sweep.stages import GridStage

    _, trials = load_sweep(write_sweep(tmp_path, seeds=[0, 1]))
    done = trials[0]
    run_experiment(done.spec, out=str(tmp_path / "t"), trial_id=done.trial_id)

    class Stream(io.StringIO):
        def isatty(self):
            return tty

    stream = Stream()
    console = SweepConsole(GridStage(trials, "t", str(tmp_path)), stream)
    console.start({})
    console.on_trial_start(0, [], FakeTrial(done.trial_id, tmp_path))
    console.on_trial_result(0, [], FakeTrial(done.trial_id, tmp_path), {"round": 1})
    console.on_trial_complete(0, [], FakeTrial(done.trial_id, tmp_path))
    console.on_trial_error(0, [], FakeTrial(trials[1].trial_id, tmp_path))
    console.finish()
    text = stream.getvalue()
    lines = [line.split("\r\x1b[K")[-1] for line in text.splitlines()]
    ok = next(line for line in lines if "seed=0" in line)
    assert "[1/2]" in ok and "acc_mean 0." in ok and "acc_worst 0." in ok
    failed = next(line for line in lines if "seed=1" in line)
    assert "failed" in failed and "RuntimeError: boom" in failed
    assert ("\x1b[" in text) == tty
    if not tty:
        assert "(done 1/2, running 0, pending 1" in ok


def test_console_line_of_a_multi_task_trial_shows_its_reported_model_per_task(tmp_path):
    """FMT-SVM reports its heads over the shared encoder and also scores the clients' own heads
    (``_own_heads``): the line shows the first, per task; the tables hold both."""
    import io

    from raylf import results
    from raylf.sweep.console import SweepConsole
    from raylf.sweep.spec import load_sweep
    from raylf.sweep.stages import GridStage

    _, trials = load_sweep(write_sweep(tmp_path))
    done = trials[0]
    row = {"trial_id": done.trial_id, "status": "ok", "wall_s": 1.0}
    for kind, value in (("acc_mean", 0.5), ("acc_worst", 0.25)):
        for task in ("binary", "multiclass"):
            row |= {f"{kind}_{task}": value, f"{kind}_{task}_own_heads": value + 0.125}
    results.write_trial(str(tmp_path / "t"), done.trial_id, {"trials": [row]}, {})
    stream = io.StringIO()
    console = SweepConsole(GridStage(trials, "t", str(tmp_path)), stream)
    console.start({})
    console.on_trial_complete(0, [], FakeTrial(done.trial_id, tmp_path))
    line = next(x for x in stream.getvalue().splitlines() if "seed=" in x)
    shown = "acc_mean_binary 0.5000  acc_mean_multiclass 0.5000  acc_worst_binary 0.2500  " \
            "acc_worst_multiclass 0.2500  1.0s"
    assert shown in line and "own_heads" not in line



def test_tune_gets_the_rounds_something_acts_on_and_the_others_once_per_report_min_s():
    def due(gate, record, now, objective=None, **ends):
        report = {k: v for k, v in record.items() if k != "val_acc_mean" or objective}
        flags = {"final": False, "diverged": False, "checkpointed": False} | ends
        return gate.due(record, report, objective, now=now, **flags)

    plain, evaluated = {"round": 2, "loss": 1.0}, {"round": 2, "acc_mean": 0.5, "val_acc_mean": 0.4}
    quiet, shown = ReportGate(min_s=10.0, evaluations=False), ReportGate(10.0, evaluations=True)
    assert due(quiet, plain, now=0.0) and due(shown, plain, now=0.0)  # the first round
    assert not due(quiet, plain, now=5.0) and not due(quiet, evaluated, now=5.0)
    assert due(shown, evaluated, now=5.0)  # --log or --verbose shows every evaluation
    assert not due(shown, plain, now=9.0)  # 10 s after the last report, not the first
    assert due(quiet, evaluated, now=6.0, objective="val_acc_mean")  # ASHA or a searcher
    for end in ("final", "diverged", "checkpointed"):
        assert due(quiet, plain, now=7.0, **{end: True})
    assert not due(quiet, plain, now=16.9) and due(quiet, plain, now=17.0)
