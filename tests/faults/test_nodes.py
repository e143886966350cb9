"""Sweeps on clusters of several nodes: a node lost mid-sweep, and a cluster that scales with its
trials. Each cluster is hosted by a child process (tests/faults/multinode.py) and the sweep joins
it with ``--address``, as on a real cluster."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from raylf import results
from tests.faults.helpers import complete_trials, kill_group, start_sweep, wait_for
from tests.faults.multinode import ClusterProcess
from tests.test_sweep import run_sweep, write_sweep

ROUNDS = 2
CLIENTS = 6  # tests.test_sweep.BASE


def assert_every_trial_once(root: Path, trial_count: int) -> dict:
    """Each trial ok with one trials row, rounds 1..ROUNDS once each, one client row per client
    and round; return the tables."""
    tables = results.load(root)
    trials = tables["trials"]
    assert len(trials) == trial_count and trials["trial_id"].is_unique
    assert set(trials["status"]) == {"ok"}
    rounds = tables["rounds"].groupby("trial_id")["round"].apply(list)
    assert set(rounds.index) == set(trials["trial_id"])
    assert rounds.map(lambda r: r == list(range(1, ROUNDS + 1))).all()
    clients = tables["clients"]
    assert len(clients) == trial_count * ROUNDS * CLIENTS
    assert not clients.duplicated(["trial_id", "round", "client_id", "task"]).any()
    return tables


@pytest.mark.slow
def test_node_lost_mid_sweep_its_trial_is_retried_on_the_other_node(tmp_path):
    gate = tmp_path / "round2.gate"
    spec = write_sweep(
        tmp_path, seeds=[0, 1], max_concurrent=2, max_failures=1, checkpoint_every=1,
        checkpoint_min_s=0, overrides={"federation.rounds": ROUNDS},
        methods=[{"name": "gated_fedavg_se", "params": {"gate_round": 2, "gate_file": str(gate)}}],
        resources={"workers": 1, "cpus_per_worker": 0.5})  # 0.75 CPU a trial: one per node
    storage = tmp_path / "out"
    root = storage / "t"
    with ClusterProcess(workers=[{"num_cpus": 1}, {"num_cpus": 1}]) as cluster:
        driver = start_sweep(spec, storage, "--address", cluster.address,
                             RAYLF_PLUGINS="tests.plugins.gates", RAY_TMPDIR=cluster.temp_dir)
        try:
            wait_for(gate.exists, 240, "a trial to reach round 2", driver)
            actor, node = gate.read_text().splitlines()
            assert node in cluster.workers
            cluster.remove(node)  # the trial's function, coordinator and worker die with it
            out, err = driver.communicate(timeout=400)
        finally:
            if driver.poll() is None:
                kill_group(driver)
        wait_for(lambda: cluster.nodes()["workers"] == [n for n in cluster.workers if n != node],
                 60, "the lost node to be declared dead and the other to live on")
    assert driver.returncode == 0, err[-3000:]
    lost = actor.split("/")[0]
    tables = assert_every_trial_once(root, 2)
    attempts = dict(zip(tables["trials"]["trial_id"], tables["trials"]["attempts"]))
    assert attempts[lost] == 2 and set(attempts.values()) == {1, 2}
    assert complete_trials(root) == set(attempts)
    (retry,) = [line for line in out.splitlines() if " retry " in line]
    assert re.search(r"attempt failed: \S", retry), retry  # a reason, never an empty one


@pytest.mark.slow
def test_autoscaling_cluster_grows_from_no_workers_to_fit_the_trials_and_back(tmp_path):
    """The head has no CPU and no GPU; Ray's autoscaler (fake provider) launches nodes of one
    CPU and one logical GPU. A trial's one bundle (0.25 CPU for its function, 0.5 CPU and the
    GPU for the one worker it trains itself) takes a node's GPU, so two concurrent trials need
    two nodes, and the nodes go once they stand idle."""
    spec = write_sweep(
        tmp_path, seeds=[0, 1], max_concurrent=2, overrides={"federation.rounds": ROUNDS},
        resources={"workers": 1, "cpus_per_worker": 0.5, "gpus_per_worker": 1})
    node_type = {"resources": {"CPU": 1, "GPU": 1}, "min_workers": 0, "max_workers": 2}
    with ClusterProcess(worker_types={"gpu_node": node_type}, idle_timeout_s=3) as cluster:
        assert cluster.workers == []
        proc = run_sweep(spec, tmp_path / "out", "--address", cluster.address,
                         RAY_TMPDIR=cluster.temp_dir)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert cluster.nodes()["peak"] == 2
        wait_for(lambda: not cluster.nodes()["workers"], 120, "the idle nodes to be removed")
    assert "an autoscaler adds nodes while trials wait for them" in proc.stdout
    assert_every_trial_once(tmp_path / "out" / "t", 2)


def test_a_cluster_that_cannot_grow_is_planned_against_what_it_has(ray_cluster):
    """The session's local Ray reports an anonymous node type per node: no autoscaling."""
    from ray._private.ray_constants import DEBUG_AUTOSCALING_STATUS
    from ray.experimental.internal_kv import _internal_kv_get

    from raylf.raycluster import capacity

    wait_for(lambda: _internal_kv_get(DEBUG_AUTOSCALING_STATUS) is not None, 60,
             "the head's autoscaler status report")
    cluster = capacity()
    assert cluster.most == cluster.now and not cluster.autoscaling
    assert (cluster.now["CPU"], cluster.now["GPU"]) == (2, 1)


def test_a_published_autoscaling_limit_is_what_the_plan_is_checked_against(
        ray_cluster, monkeypatch):
    """Autoscaler v2 and KubeRay publish the most their node groups reach (Ray's cluster
    config); the plan is checked against that, not against the nodes up now."""
    from ray._private import state

    from raylf.raycluster import capacity

    monkeypatch.setattr(state.state, "get_max_resources_from_cluster_config",
                        lambda: {"CPU": 16, "GPU": 4, "A10G": 4})
    cluster = capacity()
    assert cluster.autoscaling and (cluster.now["CPU"], cluster.now["GPU"]) == (2, 1)
    assert (cluster.most["CPU"], cluster.most["GPU"]) == (16, 4)
    assert cluster.most["A10G"] == 4 and "A10G" not in cluster.now  # only launched nodes have it
