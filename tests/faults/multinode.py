"""A Ray cluster of several nodes on this machine, hosted by a child process the tests drive.

The test session runs its own Ray, so the cluster lives in a process of its own
(``python -m tests.faults.multinode``): a head without CPUs (trials never land on it, as on the
launcher configs in ``cluster/``) and either fixed worker nodes (:class:`ray.cluster_utils.Cluster`)
or none at all and Ray's autoscaler with its fake node provider, which starts a worker node on
this machine for each node it launches. Everything it starts lives under its own temporary
directory ($RAY_TMPDIR: sessions, sockets and the address file), so a plain ``ray.init()``
elsewhere on the machine never finds it, and everything left behind is found by that path.

The host answers one JSON line per command on stdin: ``nodes`` (the live worker nodes and the
most seen at once), ``remove NODE_ID`` (that node's processes killed, as when a machine dies) and
``quit``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import psutil

OBJECT_STORE = 80 * 2**20
POLL_S = 0.2
STARTUP_S = 180.0  # a head and two nodes on a busy 2-core machine
# A killed node is declared dead after this many failed health checks a second apart (Ray's
# default: five, three seconds apart); a live but slow one still has 10 s to answer each.
HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _autoscaling_config(gcs_address: str, worker_types: dict, idle_timeout_s: float) -> dict:
    """A complete autoscaler config for the fake provider (Ray's wheel ships no defaults for
    it): a head with no resources and the given worker types."""
    return {
        "cluster_name": "raylf-faults",
        "max_workers": sum(t["max_workers"] for t in worker_types.values()),
        "provider": {"type": "fake_multinode", "gcs_address": gcs_address,
                     "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True},
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
            **{name: {"node_config": {}, **spec,
                      "resources": {"object_store_memory": OBJECT_STORE, **spec["resources"]}}
               for name, spec in worker_types.items()}},
        "head_node_type": "ray.head.default",
        "idle_timeout_minutes": idle_timeout_s / 60,
        "upscaling_speed": 1.0,
        **dict.fromkeys(("auth", "docker", "file_mounts"), {}),
        **dict.fromkeys(("initialization_commands", "setup_commands", "head_setup_commands",
                         "worker_setup_commands", "head_start_ray_commands",
                         "worker_start_ray_commands", "cluster_synced_files", "rsync_exclude",
                         "rsync_filter"), []),
        "file_mounts_sync_continuously": False,
    }


def host(workers: list[dict], worker_types: dict | None, idle_timeout_s: float) -> None:
    """Start the cluster, then serve commands until ``quit`` (or stdin closes)."""
    from ray._private.services import get_node_ip_address
    from ray.cluster_utils import Cluster

    port = _free_port()
    head = {"num_cpus": 0, "num_gpus": 0, "gcs_server_port": port, "include_dashboard": False,
            "object_store_memory": OBJECT_STORE, "_system_config": HEALTH_CHECKS,
            **{key: _free_port() for key in ("dashboard_agent_listen_port", "metrics_export_port",
                                             "runtime_env_agent_port", "metrics_agent_port")}}
    if worker_types is not None:
        os.environ.update(RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1")
        config = Path(os.environ["RAY_TMPDIR"], "autoscaling.json")
        config.write_text(json.dumps(_autoscaling_config(
            f"{get_node_ip_address()}:{port}", worker_types, idle_timeout_s)))
        head["autoscaling_config"] = str(config)
    cluster = Cluster(initialize_head=True, head_node_args=head)
    added = [cluster.add_node(wait=False, object_store_memory=OBJECT_STORE, **w) for w in workers]
    nodes = {node.node_id: node for node in added}
    cluster.wait_for_nodes(timeout=STARTUP_S)
    head_id = cluster.head_node.node_id
    peak = 0
    lock, done = threading.Lock(), threading.Event()

    def live_workers() -> list[str]:
        return sorted(n["NodeID"] for n in cluster.global_state.node_table()
                      if n["Alive"] and n["NodeID"] != head_id)

    def watch() -> None:
        nonlocal peak
        while not done.wait(POLL_S):
            with lock:
                peak = max(peak, len(live_workers()))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    print(json.dumps({"address": cluster.address, "workers": live_workers()}), flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "nodes":
            with lock:
                reply = {"workers": live_workers(), "peak": peak}
        elif command == "remove":
            cluster.remove_node(nodes.pop(args[0]), allow_graceful=False)
            reply = {"removed": args[0]}
        elif command == "quit":
            break
        else:
            reply = {"error": f"unknown command {command!r}"}
        print(json.dumps(reply), flush=True)
    done.set()
    watcher.join()
    cluster.shutdown()



def end_processes_under(temp_dir: str) -> None:
    """End every process whose command line names ``temp_dir`` (a test cluster's Ray
    daemons), each by its id, then remove the folder."""
    left = [p for p in psutil.process_iter(["cmdline"])
            if any(temp_dir in part for part in p.info["cmdline"] or [])]
    for proc in left:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=30)
    shutil.rmtree(temp_dir, ignore_errors=True)

class ClusterProcess:
    """The test's handle on a hosted cluster: start it, send it commands, and take it down
    with everything it started (autoscaled nodes included)."""

    def __init__(self, *, workers: list[dict] = (), worker_types: dict | None = None,
                 idle_timeout_s: float = 3.0):
        # short: Ray's socket paths below it must fit 107 bytes
        self.temp_dir = tempfile.mkdtemp(prefix="rlf-", dir="/tmp")
        self.env = {**os.environ, "RAY_TMPDIR": self.temp_dir, "RAY_AUTH_MODE": "disabled",
                    "RAY_USAGE_STATS_ENABLED": "0"}
        args = ["--workers", json.dumps(list(workers)), "--idle-timeout-s", str(idle_timeout_s)]
        if worker_types is not None:
            args += ["--worker-types", json.dumps(worker_types)]
        root = Path(__file__).resolve().parents[2]
        self.log = Path(self.temp_dir, "host.log")
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.multinode", *args], cwd=root,
                env={**self.env, "PYTHONPATH": str(root)}, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
        started = self._reply(STARTUP_S)
        self.address: str = started["address"]
        self.workers: list[str] = started["workers"]

    def _reply(self, seconds: float) -> dict:
        ready: list[str] = []
        reader = threading.Thread(target=lambda: ready.append(self.proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(seconds)
        if not ready or not ready[0]:
            log = self.log.read_text()[-3000:]
            self.close()
            raise RuntimeError(f"the cluster host gave no answer within {seconds:.0f} s:\n{log}")
        return json.loads(ready[0])

    def command(self, line: str, seconds: float = 60.0) -> dict:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._reply(seconds)

    def nodes(self) -> dict:
        return self.command("nodes")

    def remove(self, node_id: str) -> None:
        self.command(f"remove {node_id}")

    def close(self) -> None:
        """Quit the host (its cluster shuts down), then end whatever is still running from
        under its temporary directory, each process by its id."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=60)
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()
        end_processes_under(self.temp_dir)

    def __enter__(self) -> ClusterProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", default="[]", help="JSON list of Cluster.add_node kwargs")
    parser.add_argument("--worker-types", help="JSON autoscaler worker node types")
    parser.add_argument("--idle-timeout-s", type=float, default=3.0)
    args = parser.parse_args()
    host(json.loads(args.workers),
         json.loads(args.worker_types) if args.worker_types else None, args.idle_timeout_s)


if __name__ == "__main__":
    main()
