"""The quickstart submitted as a Ray Job to a local head (loopback only), as users run it."""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from raylf import results
from raylf.methods import METHODS
from raylf.sweep.spec import load_sweep

ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).parent / "ray")
# One seed of two of the quickstart's methods: the submission path is what is tested, and each
# trial more costs the suite ~10 s of process start-up on a fresh head.
SUBSET = ["seeds=[0]", "methods=[{name: fedavg_se}, {name: hdcfl}]"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_gone(pgid: int, seconds: float) -> None:
    """Poll until no process of group ``pgid`` is left (a killed head's raylet, GCS, agents)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(pgid, signal.SIGKILL)
    raise TimeoutError(f"process group {pgid} still alive after {seconds:.0f} s")


def _wait_for(url: str, seconds: float) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except (OSError, http.client.HTTPException):
            time.sleep(1)
    raise TimeoutError(f"{url} did not answer within {seconds:.0f} s")


@pytest.mark.slow
def test_quickstart_as_a_ray_job_on_a_local_head(tmp_path):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    # Every port explicit and free: another Ray on this machine (the session fixture's) already
    # holds the defaults, and a head whose job agent cannot bind never accepts jobs.
    ports = {flag: _free_port() for flag in (
        "port", "dashboard-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
        "runtime-env-agent-port", "metrics-export-port")}
    dashboard = ports["dashboard-port"]
    # Its own temp dir (short: Ray's socket paths must fit 107 bytes), so the head's address file
    # is not /tmp/ray/ray_current_cluster: once the head is gone, a plain ray.init() elsewhere on
    # the machine would try to join it.
    temp_dir = tempfile.mkdtemp(prefix="rayjob-", dir="/tmp")
    head = subprocess.Popen(
        [RAY, "start", "--head", "--block", "--num-cpus=2", "--num-gpus=1",
         "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", "--include-dashboard=true",
         f"--temp-dir={temp_dir}", *(f"--{flag}={port}" for flag, port in ports.items())],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    address = f"http://127.0.0.1:{dashboard}"
    try:
        _wait_for(f"{address}/api/version", 180)
        storage = tmp_path / "out"
        for _ in range(6):  # the head's job agent registers a little after the dashboard
            job = subprocess.run(
                [RAY, "job", "submit", "--address", address, "--working-dir", str(ROOT), "--",
                 sys.executable, "-m", "raylf.sweep", "tune/quickstart.yaml", "--storage",
                 str(storage), *(arg for s in SUBSET for arg in ("--set", s))],
                env=env, capture_output=True, text=True, timeout=1200, cwd=ROOT)
            if "No available agent" not in job.stdout + job.stderr:
                break
            time.sleep(10)
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)
        wait_until_gone(head.pid, 60)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "succeeded" in job.stdout
    assert "leaderboard" in job.stdout
    _, trials = load_sweep(ROOT / "tune/quickstart.yaml", SUBSET)
    assert len(trials) == 2
    table = results.load(storage / "quickstart")["trials"]
    assert sorted(table["trial_id"]) == sorted(t.trial_id for t in trials)
    assert set(table["status"]) == {"ok"}
    # every trial records its spec resolved: the test share and every HDC-FL parameter, none of
    # which the quickstart sets, at their defaults
    hdcfl = table.set_index("method").loc["hdcfl"]
    assert hdcfl["scenario.test_fraction"] == 0.25
    for name, value in METHODS.get("hdcfl").Params().model_dump(mode="json").items():
        if name not in ("groups", "activation", "refresh_every"):  # the quickstart sets those
            assert hdcfl[f"method.params.{name}"] == value, name
