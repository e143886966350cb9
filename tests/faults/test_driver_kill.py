"""The sweep driver SIGKILLed at four points of one sweep, then run again each time: every trial
ends up exactly once in the tables, a finished trial is never run again, and once the sweep is
done no checkpoint is left."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from raylf import results
from raylf.checkpoints import CHECKPOINTS_KEPT
from tests.faults.helpers import (
    attempts,
    complete_trials,
    kill_group,
    start_sweep,
    wait_for,
)
from tests.test_sweep import run_sweep, write_sweep

PLUGINS = {"RAYLF_PLUGINS": "tests.plugins.gates"}
ROUNDS = 5  # checkpoints after rounds 1-4 (the last round has none): more than Tune keeps


@pytest.mark.slow
@pytest.mark.timeout(1200)  # five driver starts: on a busy 2-core machine near the default 600 s
def test_driver_killed_at_start_mid_trial_after_dropping_checkpoints_and_writing_tables(
        tmp_path):
    mid_trial = tmp_path / "mid-trial.gate"
    spec = write_sweep(
        tmp_path, seeds=[0, 1], max_concurrent=1, checkpoint_every=1, checkpoint_min_s=0,
        overrides={"federation.rounds": ROUNDS},
        methods=[{"name": "gated_fedavg_se",
                  "params": {"gate_round": 2, "gate_file": str(mid_trial)}}],
        resources={"workers": 1, "cpus_per_worker": 0.5})
    storage = tmp_path / "out"
    root = storage / "t"

    # 1. during start: the sweep has claimed its directory and Tune has saved its tuner, but no
    # experiment state yet (removed where Tune got that far before the kill)
    driver = start_sweep(spec, storage, **PLUGINS)
    wait_for(lambda: (root / "sweep.json").exists() and any(root.rglob("tuner.pkl")), 180,
             "the sweep to claim its directory and save its tuner", driver)
    kill_group(driver)
    for state in root.rglob("experiment_state-*.json"):
        state.unlink()
    assert not complete_trials(root)

    # 2. mid-trial: the first trial is held inside round 2, after checkpointing round 1
    driver = start_sweep(spec, storage, **PLUGINS)
    wait_for(mid_trial.exists, 180, "the first trial to reach round 2", driver)
    kill_group(driver)
    held = mid_trial.read_text().split("/")[0]
    assert not complete_trials(root)

    # 3. between trials: the first trial's tables are complete and it has dropped its
    # checkpoints, but Tune has not seen it end: the next run restores it from a checkpoint
    # whose files are gone, and it must only report its tables
    dropped = tmp_path / "dropped.gate"
    driver = start_sweep(spec, storage, RAYLF_DROP_GATE=str(dropped), **PLUGINS)
    wait_for(dropped.exists, 180, "the first trial to drop its checkpoints", driver)
    kill_group(driver)
    finished = complete_trials(root)
    assert finished == {held} == {dropped.read_text()}
    attempts_when_finished = {t: attempts(root, t) for t in finished}
    assert attempts_when_finished[held] == 2  # started in run 2, resumed in run 3
    assert list(root.glob(f"{held}/checkpoint_*"))  # Tune restores only from a folder it finds
    assert not list(root.glob(f"{held}/checkpoint_*/*"))
    assert not (root / "checkpoints" / held).exists()

    # 4. while tables are written: the next trial stops before its trials row (written last)
    writing_gate = tmp_path / "tables.gate"
    driver = start_sweep(spec, storage, RAYLF_TABLE_GATE=str(writing_gate), **PLUGINS)
    wait_for(writing_gate.exists, 180, "a trial to start writing its tables", driver)
    kill_group(driver)
    writing = writing_gate.read_text()
    assert (root / "tables" / "rounds" / f"{writing}.parquet").exists()
    assert results.read_trial(root, writing)["status"] == results.STARTED  # its end's row: last
    assert writing not in complete_trials(root)
    # not finished: a later resume may restore any checkpoint Tune still keeps, and each
    # still has its personal state
    kept = [torch.load(state, weights_only=True)
            for state in root.glob(f"{writing}/checkpoint_*/state.pt")]
    assert len(kept) == CHECKPOINTS_KEPT
    for snapshot in kept:
        assert list(Path(snapshot["personal"]).glob("worker-*.pt")), snapshot["personal"]

    # 5. to the end
    proc = run_sweep(spec, storage, "--resume", **PLUGINS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables = results.load(root)
    trials = tables["trials"]
    assert len(trials) == 2 and trials["trial_id"].is_unique
    assert set(trials["status"]) == {"ok"}
    counts = dict(zip(trials["trial_id"], trials["attempts"]))
    assert {t: counts[t] for t in finished} == attempts_when_finished  # not run again
    rounds = tables["rounds"].groupby("trial_id")["round"].apply(list)
    assert rounds.map(lambda r: r == list(range(1, ROUNDS + 1))).all()
    clients = tables["clients"]
    assert len(clients) == 2 * ROUNDS * 6
    assert not clients.duplicated(["trial_id", "round", "client_id", "task"]).any()
    assert "resuming: 1 of 2 trials already finished" in proc.stdout
    # every trial has ended for good: nothing a resume would read is left
    assert not list(root.rglob("checkpoint_*/*"))
    assert not list((root / "checkpoints").rglob("*.pt"))


@pytest.mark.slow
def test_driver_killed_mid_group_resumes_the_held_trial_and_runs_the_rest_once(tmp_path):
    """Three trials in one Tune trial (``trials_per_tune_trial: 3``): the driver is killed while
    the group's first trial is held in round 2 (checkpointed after round 1). That trial's row
    says ``started``; the others have none. Run again: Tune restores the group, the held trial
    runs again as its second attempt, the others once, and every round is recorded once."""
    gate = tmp_path / "mid-group.gate"
    spec = write_sweep(
        tmp_path, seeds=[0, 1, 2], trials_per_tune_trial=3, checkpoint_every=1,
        checkpoint_min_s=0, overrides={"federation.rounds": ROUNDS},
        methods=[{"name": "gated_fedavg_se", "params": {"gate_round": 2, "gate_file": str(gate)}}],
        resources={"workers": 1, "cpus_per_worker": 0.5})
    storage = tmp_path / "out"
    root = storage / "t"
    driver = start_sweep(spec, storage, **PLUGINS)
    wait_for(gate.exists, 180, "the group's first trial to reach round 2", driver)
    kill_group(driver)
    rows = results.load(root)["trials"]
    assert list(rows["status"]) == [results.STARTED] and list(rows["attempts"]) == [1]
    held = rows["trial_id"].iloc[0]
    assert not complete_trials(root) and len(list(root.glob("*-and-2"))) == 1

    proc = run_sweep(spec, storage, **PLUGINS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables = results.load(root)
    trials = tables["trials"]
    assert len(trials) == 3 and trials["trial_id"].is_unique and set(trials["status"]) == {"ok"}
    assert dict(zip(trials["trial_id"], trials["attempts"])) == {
        t: 2 if t == held else 1 for t in trials["trial_id"]}
    assert held == sorted(trials["trial_id"])[0]  # a group runs its trials in trial-id order
    rounds = tables["rounds"].groupby("trial_id")["round"].apply(list)
    assert rounds.map(lambda r: r == list(range(1, ROUNDS + 1))).all()
    clients = tables["clients"]
    assert len(clients) == 3 * ROUNDS * 6
    assert not clients.duplicated(["trial_id", "round", "client_id", "task"]).any()
    assert not list(root.rglob("checkpoint_*/*"))  # every trial ended: no resume state left
