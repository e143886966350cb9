"""The cluster path end to end, once: a sweep submitted with ``ray job submit`` to a head and a
worker node started with ``ray start`` on loopback, its storage on the S3 endpoint (the ``s3``
fixture). Every node has the endpoint and credentials in its environment, as the cluster README
asks; the submitting shell has none."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

from raylf import results
from tests.faults.helpers import listing
from tests.faults.multinode import end_processes_under
from tests.test_ray_job import RAY, _free_port, _wait_for, wait_until_gone
from tests.test_sweep import ROOT, write_sweep

ROUNDS = 2
CLIENTS = 6  # tests.test_sweep.BASE
AGENT_PORTS = ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
               "runtime-env-agent-port", "metrics-export-port")


def alive_nodes(dashboard: str) -> int:
    with urllib.request.urlopen(f"{dashboard}/api/v0/nodes", timeout=10) as reply:
        nodes = json.loads(reply.read())["data"]["result"]["result"]
    return sum(node["state"] == "ALIVE" for node in nodes)


def stop(nodes: list[subprocess.Popen], temp_dir: str) -> None:
    """SIGKILL each ``ray start --block`` group (a throwaway cluster: a graceful stop takes
    half a minute), then end whatever still runs from under the cluster's temporary directory,
    each process by its id."""
    for node in nodes:
        os.killpg(node.pid, signal.SIGKILL)
        node.wait(timeout=60)
        wait_until_gone(node.pid, 60)
    end_processes_under(temp_dir)


@pytest.mark.slow
def test_job_on_a_head_and_a_worker_node_writes_its_tables_to_s3(s3, tmp_path):
    spec = write_sweep(tmp_path, seeds=[0], checkpoint_every=1, checkpoint_min_s=0,
                       overrides={"federation.rounds": ROUNDS},
                       methods=[{"name": "fedavg_se"}], keep_final_states=["fedavg_se"],
                       resources={"workers": 1, "cpus_per_worker": 0.5})
    storage = s3.uri(tmp_path.name)
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    base.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    node_env = {**base, **s3.env()}
    # short: Ray's socket paths below it must fit 107 bytes
    temp_dir = tempfile.mkdtemp(prefix="rlfs3-", dir="/tmp")
    gcs, dashboard_port = _free_port(), _free_port()
    dashboard = f"http://127.0.0.1:{dashboard_port}"
    ports = [f"--{flag}={_free_port()}" for flag in AGENT_PORTS]
    nodes = [subprocess.Popen(
        [RAY, "start", "--head", "--block", "--num-cpus=0", "--num-gpus=0", f"--port={gcs}",
         "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", "--include-dashboard=true",
         f"--dashboard-port={dashboard_port}", f"--temp-dir={temp_dir}", *ports],
        env=node_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)]
    try:
        _wait_for(f"{dashboard}/api/version", 180)
        ports = [f"--{flag}={_free_port()}" for flag in AGENT_PORTS]
        nodes.append(subprocess.Popen(
            [RAY, "start", "--block", f"--address=127.0.0.1:{gcs}", "--num-cpus=2",
             "--num-gpus=0", "--node-ip-address=127.0.0.1", *ports],
            env=node_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True))
        deadline = time.monotonic() + 180
        while alive_nodes(dashboard) < 2:
            assert time.monotonic() < deadline, "the worker node never joined"
            time.sleep(0.5)
        for _ in range(6):  # the head's job agent registers a little after the dashboard
            job = subprocess.run(
                [RAY, "job", "submit", "--address", dashboard, "--", sys.executable, "-m",
                 "raylf.sweep", str(spec), "--storage", storage],
                env=base, capture_output=True, text=True, timeout=600, cwd=ROOT)
            if "No available agent" not in job.stdout + job.stderr:
                break
            time.sleep(10)
    finally:
        stop(nodes, temp_dir)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "succeeded" in job.stdout and f"tables: {storage}/t/tables/" in job.stdout
    root = f"{storage}/t"
    tables = results.load(root)
    (trial,) = tables["trials"].to_dict("records")
    assert trial["status"] == "ok" and trial["attempts"] == 1
    assert list(tables["rounds"]["round"]) == list(range(1, ROUNDS + 1))
    assert len(tables["clients"]) == ROUNDS * CLIENTS
    # the head has no CPU: the personal state was written by a worker on the worker node; the
    # final one is kept (keep_final_states), the earlier ones are gone
    assert [i.base_name for i in listing(root, f"checkpoints/{trial['trial_id']}")] == [
        f"round-{ROUNDS}"]
    assert [i.base_name for i in listing(root, f"checkpoints/{trial['trial_id']}/round-{ROUNDS}")
            ] == ["worker-0.pt"]
