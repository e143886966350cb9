"""Fixtures of the fault suite."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def read_only():
    """``read_only(path)`` makes a directory tree refuse writes until the test ends: by its
    permission bits, or, for root (whom permission bits do not stop), a read-only bind mount."""
    undo = []

    def make(path: Path) -> None:
        if os.geteuid() == 0:
            subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
            undo.append(["umount", str(path)])
            subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], check=True)
            return
        for folder, dirs, files in os.walk(path):
            for name in [*dirs, *files, "."]:
                item = Path(folder, name)
                undo.append((item, item.stat().st_mode))
                item.chmod(item.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))

    yield make
    for step in reversed(undo):
        if isinstance(step, list):
            subprocess.run(step, check=True)
        else:
            step[0].chmod(step[1])


@pytest.fixture
def small_disk():
    """``small_disk(path, mib)`` mounts a tmpfs of ``mib`` MiB at ``path`` until the test ends
    and returns ``fill()``, which writes to it until the kernel answers ENOSPC: a disk that
    really is full, for every process writing there (Ray's and Tune's included). Where no tmpfs
    can be mounted (not root, or no CAP_SYS_ADMIN) the test is skipped."""
    mounted = []

    def make(path: Path, mib: int):
        if os.geteuid() != 0:
            pytest.skip("mounting a size-limited tmpfs needs root")
        mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(path)],
                               capture_output=True, text=True)
        if mount.returncode:  # a container without CAP_SYS_ADMIN
            pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
        mounted.append(path)

        def fill() -> None:
            chunk = b"\0" * 2**16
            with (path / "filler").open("wb", buffering=0) as f:
                try:
                    while True:
                        f.write(chunk)
                except OSError as err:
                    if err.errno != errno.ENOSPC:
                        raise

        return fill

    yield make
    for path in mounted:
        subprocess.run(["umount", str(path)], check=True)
