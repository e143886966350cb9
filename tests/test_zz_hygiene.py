"""Runs last (pytest takes test files in name order): the suite has left no Ray state behind.

A ``ray_current_cluster`` file naming a head that is gone makes the next plain ``ray.init()`` on
this machine (any user script) try to join it; an orphaned GCS or raylet (its driver killed
without its process group) holds ports and memory until reboot.
"""

from __future__ import annotations

import socket
from pathlib import Path

import psutil
from ray._common.utils import get_ray_address_file

RAY_DAEMONS = ("gcs_server", "raylet")


def test_no_address_file_names_a_dead_head():
    path = Path(get_ray_address_file(None))
    if not path.exists():
        return
    host, _, port = path.read_text().strip().rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        raise AssertionError(f"{path} names {host}:{port}, where no Ray head answers ({err}); "
                             "a test started a head without its own --temp-dir") from None


def test_no_orphaned_ray_daemons_started_during_the_session():
    session_start = psutil.Process().create_time()
    orphans = []
    for proc in psutil.process_iter(["name", "ppid", "create_time", "cmdline"]):
        info = proc.info
        if info["name"] in RAY_DAEMONS and info["ppid"] in (0, 1) \
                and info["create_time"] >= session_start:
            orphans.append(f"{proc.pid} {' '.join(info['cmdline'] or [])[:120]}")
    assert not orphans, "Ray daemons left running by the suite:\n" + "\n".join(orphans)
