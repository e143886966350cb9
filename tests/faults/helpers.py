"""Driving a sweep the way a user's shell does, and killing it the way a crash does."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.fs as pafs

from raylf import results
from tests.test_sweep import ROOT, env, sweep_cmd


def wait_for(condition, seconds: float, what: str,
             driver: subprocess.Popen | None = None) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``seconds``, or at once
    with its output when ``driver`` exits first."""
    deadline = time.monotonic() + seconds
    while not condition():
        if driver is not None and driver.poll() is not None:
            out, err = driver.communicate()
            raise AssertionError(f"the sweep exited ({driver.returncode}) before {what}:\n"
                                 f"{out[-2000:]}\n{err[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {seconds:.0f} s for {what}")
        time.sleep(0.05)


def start_sweep(spec: Path, storage: Path, *extra: str, **more) -> subprocess.Popen:
    """The driver in its own process group, so a kill takes its local Ray down with it."""
    return subprocess.Popen(sweep_cmd(spec, storage, *extra), cwd=ROOT, env=env(**more),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def kill_group(driver: subprocess.Popen) -> str:
    """SIGKILL the driver and every process of its group, wait until all are gone; return what
    the driver printed (stdout, then stderr)."""
    os.killpg(driver.pid, signal.SIGKILL)
    out, err = driver.communicate()
    wait_for(lambda: not group_alive(driver.pid), 60, f"process group {driver.pid} to exit")
    return out + err


def listing(root: Path | str, folder: str) -> list[pafs.FileInfo]:
    """What ``root/folder`` holds (nothing if it does not exist); ``root`` a path or a URI."""
    fs, base = results.filesystem(root)
    return fs.get_file_info(pafs.FileSelector(f"{base}/{folder}", allow_not_found=True))


def complete_trials(root: Path | str) -> set[str]:
    """Trials whose three tables are all in place, the trials row of an attempt's end among
    them (not the ``started`` row an attempt writes first)."""
    present = [{i.base_name.removesuffix(".parquet") for i in listing(root, f"tables/{name}")
                if i.base_name.endswith(".parquet")} for name in results.TABLES]
    return {t for t in set.intersection(*present)
            if results.read_trial(root, t)["status"] != results.STARTED}


def attempts(root: Path | str, trial_id: str) -> int:
    """The starts of a trial so far: its trials row's count (each attempt writes it as
    ``started`` before it runs, and again at its end); 0 if it never started."""
    row = results.read_trial(root, trial_id)
    return 0 if row is None else int(row["attempts"])
