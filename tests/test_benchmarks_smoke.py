"""Smoke run of the benchmark harness: ``python benchmarks/run.py --quick`` writes its table.

Runs in a subprocess (the harness starts and stops its own Ray). Quick mode never includes the
peer frameworks (Flower, pfl), so this test needs neither venv and is never skipped. No
wall-time assertions.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_run_writes_expected_table(tmp_path):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick",
                           "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=290)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "### overhead" in proc.stdout and "### scaling" in proc.stdout

    table = pq.read_table(tmp_path / "results.parquet")
    for column in ("section", "workload", "variant", "clients", "participants", "round_s",
                   "ratio_to_floor", "acc_mean", "max_acc_diff_vs_floor", "peak_rss_gib",
                   "peak_pss_gib", "fit_s", "dispatch_s", "evaluate_s"):
        assert column in table.column_names, column
    machine = json.loads(table.schema.metadata[b"machine"])
    assert {"cpu", "cores", "ram_gib", "torch", "ray", "git_sha"} <= set(machine)

    rows = table.to_pylist()
    keys = {(r["section"], r["workload"], r["variant"]) for r in rows}
    expected = {
        ("overhead", "tiny", "floor"), ("overhead", "tiny", "local"),
        ("overhead", "tiny", "ray-1w"), ("overhead", "tiny", "ray-2w"),
        ("overhead", "heavy", "floor"), ("overhead", "heavy", "floor-raylf-layout"),
        ("overhead", "heavy", "local"), ("overhead", "heavy", "floor-pair"),
        ("overhead", "heavy", "ray-1w"), ("overhead", "heavy", "ray-2w"),
        ("phases", "tiny", "local"),
        ("scaling", "synthetic-100", "ray-1w"), ("scaling", "synthetic-1000", "ray-1w"),
    }
    assert expected <= keys, expected - keys
    # quick mode leaves the peers out, and says so
    assert not any(r["section"] in ("flower", "pfl") for r in rows)
    assert "[pfl] skipped: --quick" in proc.stderr

    for r in rows:
        assert r["round_s"] > 0 and math.isfinite(r["round_s"]), r
    for r in rows:
        if r["section"] == "overhead" and r["variant"] != "floor-raylf-layout":
            # identical work: every backend reproduces the per-client accuracies of the floor
            # that does the same arithmetic (for the heavy CNN, the channels-last floor)
            assert r["max_acc_diff_vs_floor"] == 0.0, r
            assert r["ratio_to_floor"] > 0
    pair, two = (next(r for r in rows if r["workload"] == "heavy" and r["variant"] == v)
                 for v in ("floor-pair", "ray-2w"))
    assert pair["ratio_to_floor"] > 0  # both copies of the floor ran (their accuracies: above)
    assert two["parallel_bound"] > 0 and math.isfinite(two["parallel_bound"])
    for r in rows:
        if r["section"] == "scaling":
            assert 0 < r["peak_pss_gib"] <= r["peak_rss_all_gib"]
            assert r["participants"] == 10
    assert (tmp_path / "results.json").exists() and (tmp_path / "results.md").exists()


def test_storage_writes_counts_each_write_and_each_publish_once(tmp_path):
    """The scaling benchmark's write counter: a file written twice counts twice, a staged
    file renamed into place (raylf.storage.publish) once, as the rename, in a folder made
    after the count started too."""
    import time

    import pyarrow.fs as pafs

    from benchmarks.storage_writes import StorageWrites
    from raylf.storage import publish

    writes = StorageWrites(tmp_path, lambda path: None if ".staging" in path else
                           path.split("/")[0]).start()

    def counted(total: int) -> None:  # the kernel's events arrive asynchronously
        deadline = time.monotonic() + 30
        while sum(writes.objects.values()) < total and time.monotonic() < deadline:
            time.sleep(0.05)

    try:
        (tmp_path / "state.json").write_text("1")
        counted(1)  # (the kernel merges an identical event still queued: a rewrite waits)
        (tmp_path / "state.json").write_text("22")
        publish(pafs.LocalFileSystem(), str(tmp_path / "tables" / "t" / "a.parquet"), b"abc")
        counted(3)
    finally:
        writes.stop()
    assert dict(writes.objects) == {"state.json": 2, "tables": 1}
    assert writes.bytes["tables"] == 3 and writes.overflows == 0
