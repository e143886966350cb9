"""The suite leaves no Ray state behind: checked once every test has ended, by the process that
ran the session (the xdist controller, or pytest itself with ``-n 0``), from ``conftest.py``'s
``pytest_sessionfinish``: under xdist no test can be sure it runs last, and a check made while
another worker still drives a sweep would see that sweep's daemons.

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


def dead_head_address_file() -> list[str]:
    """The address file when it names a head that no longer answers."""
    path = Path(get_ray_address_file(None))
    if not path.exists():
        return []
    host, _, port = path.read_text().strip().rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        return [f"{path} names {host}:{port}, where no Ray head answers ({err}); a test started "
                "a head without its own --temp-dir"]
    return []


def orphaned_daemons() -> list[str]:
    """Ray daemons started since this process began whose parent is gone (reparented to init)."""
    session_start = psutil.Process().create_time()
    orphans = []
    for proc in psutil.process_iter(["name", "ppid", "create_time", "cmdline"]):
        info = proc.info
        if info["name"] in RAY_DAEMONS and info["ppid"] in (0, 1) \
                and info["create_time"] >= session_start:
            orphans.append(f"{proc.pid} {' '.join(info['cmdline'] or [])[:120]}")
    return [f"Ray daemon left running by the suite: {line}" for line in orphans]


def problems() -> list[str]:
    return dead_head_address_file() + orphaned_daemons()
