"""Fixtures of the fault suite."""

from __future__ import annotations

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
