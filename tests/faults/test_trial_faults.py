"""Faults inside trials: what the user finds in the console and the tables afterwards."""

from __future__ import annotations

import re

import pytest

from raylf import results
from tests.faults.helpers import complete_trials, kill_group, start_sweep, wait_for
from tests.test_sweep import run_sweep, write_sweep

MEASURED = re.compile(r".*(_s|_mb)$")  # seconds and memory: measured, not computed


@pytest.mark.slow
@pytest.mark.parametrize("per_tune_trial", [1, 6])
def test_raising_diverging_and_overtime_trials_are_recorded_and_the_sweep_goes_on(
        tmp_path, per_tune_trial):
    """Each trial its own Tune trial, or all six in one group (``trials_per_tune_trial``): the
    same tables, attempts and console lines. The group's first attempt runs every trial, three
    fail; Tune retries the group, which runs those three again, two pass; the third fails for
    good and the group with it, the others' results kept."""
    spec = write_sweep(
        tmp_path, checkpoint_every=1, checkpoint_min_s=0, max_failures=1,
        trials_per_tune_trial=per_tune_trial,
        overrides={"federation.rounds": 3},
        methods=[
            {"name": "faulty_once", "params": {"fail_round": 2, "marker": str(tmp_path / "once")}},
            {"name": "faulty_once", "params": {"fail_round": 2, "marker": str(tmp_path / "always"),
                                               "failures": 5}},
            {"name": "fedavg", "grid": {"federation.optimizer.lr": [1.0e6]}},
            {"name": "fedprox", "grid": {"resources.trial_timeout_s": [1.0e-3]}},
            {"name": "faulty_once", "grid": {"resources.round_timeout_s": [10.0]},
             "params": {"fail_round": 2, "marker": str(tmp_path / "hangs"), "hang": True}},
            {"name": "fedavg"}],
        resources={"workers": 1, "cpus_per_worker": 0.5})
    proc = run_sweep(spec, tmp_path / "out", RAYLF_PLUGINS="tests.plugins.faulty")
    assert proc.returncode == 1, proc.stderr[-3000:]  # one trial failed after its retry
    trials = results.load(tmp_path / "out" / "t")["trials"]
    by_marker = trials.set_index(trials["method.params.marker"].fillna(trials["method"]))
    retried, failed = by_marker.loc[str(tmp_path / "once")], by_marker.loc[str(tmp_path / "always")]
    assert (retried["status"], retried["attempts"]) == ("ok", 2)
    # one worker trains in the trial's own process: its round timeout still ends a hung round
    hung = by_marker.loc[str(tmp_path / "hangs")]
    assert (hung["status"], hung["attempts"], hung["backend"]) == ("ok", 2, "inline")
    assert (failed["status"], failed["attempts"]) == ("failed", 2)
    assert "injected worker failure in round 2" in failed["error"]
    diverged, overtime = by_marker.loc["fedavg"], by_marker.loc["fedprox"]
    diverged = diverged[diverged["federation.optimizer.lr"] == 1.0e6].iloc[0]
    assert (diverged["status"], diverged["diverged_round"]) == ("diverged", 1)
    assert "lower federation.optimizer.lr" in diverged["error"]
    assert overtime["status"] == "timeout" and overtime["rounds"] == 1
    assert "exceeds resources.trial_timeout_s=0.001" in overtime["error"]
    assert set(trials["status"]) == {"ok", "failed", "diverged", "timeout"} and len(trials) == 6
    lines = proc.stdout.splitlines()
    assert sum(" retry " in line for line in lines) == 3  # each faulty trial's first attempt
    assert any(" retry " in line and "round 2 took longer than resources.round_timeout_s=10 s"
               in line for line in lines), proc.stdout
    assert "cannot write to" not in proc.stdout  # a round timeout is no storage failure
    for status, reason in [("failed", "RuntimeError: injected worker failure in round 2"),
                           ("diverged", "diverged in round 1"),
                           ("timeout", "stopped after round 1")]:
        assert any(f"] {status} " in line and reason in line for line in lines), proc.stdout
    assert "leaderboard" in proc.stdout


@pytest.mark.slow
def test_killed_worker_resumes_from_checkpoint_with_the_tables_of_an_unbroken_run(tmp_path):
    """fedavg_se keeps a private head per client on its worker: the resumed trial must get those
    back from the checkpoint to match a run that was never interrupted, number for number."""
    broken, unbroken = tmp_path / "broken.gate", tmp_path / "unbroken.gate"
    unbroken.write_text("open")  # an existing gate never closes: this trial runs straight through
    spec = write_sweep(
        tmp_path, checkpoint_every=2, checkpoint_min_s=0, max_failures=1, max_concurrent=2,
        overrides={"federation.rounds": 5},
        methods=[{"name": "gated_fedavg_se",
                  "params": {"gate_round": 3, "kill_worker": True},
                  "grid": {"method.params.gate_file": [str(broken), str(unbroken)]}}],
        resources={"workers": 2, "cpus_per_worker": 0.25})
    proc = run_sweep(spec, tmp_path / "out", RAYLF_PLUGINS="tests.plugins.gates")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"/worker-\d$", broken.read_text())  # a worker died inside round 3
    tables = results.load(tmp_path / "out" / "t")
    trials = tables["trials"].set_index("method.params.gate_file")
    assert trials.loc[str(broken), "attempts"] == 2 and trials.loc[str(unbroken), "attempts"] == 1
    assert set(trials["status"]) == {"ok"}
    for name in ("rounds", "clients"):
        table = tables[name]
        ids = {g: trials.loc[g, "trial_id"] for g in (str(broken), str(unbroken))}
        kept = [c for c in table.columns if c != "trial_id" and not MEASURED.match(c)]
        parts = [table.loc[table.trial_id == ids[g], kept].reset_index(drop=True)
                 for g in (str(broken), str(unbroken))]
        assert len(parts[0]) > 0
        assert parts[0].equals(parts[1]), name


@pytest.mark.slow
@pytest.mark.parametrize("stops", ["read_only", "full"])
def test_storage_that_stops_accepting_writes_stops_the_sweep_naming_the_path(
        tmp_path, request, stops):
    """The storage turns read-only, or fills up (ENOSPC), once the first trial has finished and
    while the second is held in round 2."""
    gate = tmp_path / "second.gate"
    spec = write_sweep(
        tmp_path, max_concurrent=2, max_failures=0, checkpoint_min_s=0,
        overrides={"federation.rounds": 3},
        methods=[{"name": "fedavg"},
                 {"name": "gated_fedavg_se", "params": {"gate_round": 2, "gate_file": str(gate)}}],
        resources={"workers": 1, "cpus_per_worker": 0.5})
    storage = tmp_path / "out"
    root = storage / "t"
    if stops == "full":
        storage.mkdir()
        fill = request.getfixturevalue("small_disk")(storage, 64)
    driver = start_sweep(spec, storage, RAYLF_PLUGINS="tests.plugins.gates")
    try:
        wait_for(lambda: gate.exists() and complete_trials(root), 240,
                 "the first trial's tables, with the second trial in round 2", driver)
        before = results.load(root)["trials"]
        if stops == "full":
            fill()
        else:
            request.getfixturevalue("read_only")(storage)
        gate.with_name(gate.name + ".release").touch()
        out, err = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            kill_group(driver)
    assert driver.returncode == 1, err[-3000:]
    assert f"cannot write to {root}" in err and "tables of finished trials are intact" in err
    if stops == "full":
        assert "No space left on device" in err
    after = results.load(root)["trials"]
    assert list(before["trial_id"]) == list(after["trial_id"])  # nothing written since
    ended = after[after["status"] != results.STARTED]  # the held trial's row: still `started`
    assert list(ended["trial_id"]) == [t for t in after["trial_id"] if "-fedavg-" in t]
    assert set(ended["status"]) == {"ok"}
