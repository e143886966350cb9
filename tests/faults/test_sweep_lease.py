"""Two drivers, one sweep directory, as a user's shell starts them: while the first runs, a
second exits 2 naming it; once the first is SIGKILLed (its lease left behind), the next takes the
lease over and the sweep resumes, every trial exactly once in the tables."""

from __future__ import annotations

import json
import os
import socket

import pytest

from raylf import results
from tests.faults.helpers import complete_trials, kill_group, start_sweep, wait_for
from tests.test_sweep import ROOT, run_sweep, write_sweep

PLUGINS = {"RAYLF_PLUGINS": "tests.plugins.gates"}
ROUNDS = 3


@pytest.mark.slow
@pytest.mark.timeout(900)  # two driver starts on a busy 2-core machine
def test_a_second_driver_is_refused_and_a_killed_drivers_lease_is_taken_over(tmp_path):
    gate = tmp_path / "round2.gate"
    spec = write_sweep(
        tmp_path, seeds=[0, 1], max_concurrent=1, checkpoint_every=1, checkpoint_min_s=0,
        overrides={"federation.rounds": ROUNDS},
        methods=[{"name": "gated_fedavg_se", "params": {"gate_round": 2, "gate_file": str(gate)}}],
        resources={"workers": 1, "cpus_per_worker": 0.5})
    # a relative --storage, as a user types it: resolved before Ray starts (Tune refuses one)
    storage = os.path.relpath(tmp_path / "out", ROOT)
    root = tmp_path / "out" / "t"

    first = start_sweep(spec, storage, **PLUGINS)
    try:
        wait_for(gate.exists, 240, "the first trial to reach round 2", first)
        second = run_sweep(spec, storage, **PLUGINS)
    finally:
        kill_group(first)
    holder = f"driver pid {first.pid} on host {socket.gethostname()} (this sweep), running since"
    assert second.returncode == 2, second.stderr[-3000:]
    assert f"--storage: {root} is in use by another sweep driver: {holder}" in second.stderr
    assert "sweep t:" not in second.stdout  # refused before its plan, before Ray started
    (left,) = (root / ".lease").glob("*.json")  # the killed driver's, never released
    assert json.loads(left.read_text())["pid"] == first.pid
    assert not json.loads(left.read_text())["released"]
    assert not complete_trials(root)

    third = run_sweep(spec, storage, **PLUGINS)
    assert third.returncode == 0, third.stderr[-3000:]
    assert f"lease: took over {root} from a stale lease" in third.stdout
    assert holder in third.stdout
    tables = results.load(root)
    trials = tables["trials"]
    assert len(trials) == 2 and trials["trial_id"].is_unique and set(trials["status"]) == {"ok"}
    rounds = tables["rounds"].groupby("trial_id")["round"].apply(list)
    assert set(rounds.index) == set(trials["trial_id"])
    assert rounds.map(lambda r: r == list(range(1, ROUNDS + 1))).all()
    clients = tables["clients"]
    assert len(clients) == 2 * ROUNDS * 6
    assert not clients.duplicated(["trial_id", "round", "client_id", "task"]).any()
    (record,) = (root / ".lease").glob("*.json")  # the third driver's, released on exit
    assert record.name != left.name and json.loads(record.read_text())["released"]
