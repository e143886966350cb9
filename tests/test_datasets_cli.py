"""``python -m raylf.datasets`` and bring-your-own data through ``python -m raylf.run``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import raylf.datasets
from raylf.data import standin
from raylf.data.sources import SOURCES
from raylf.datasets import main
from raylf.run import main as run_main
from tests.test_sources import mark_complete

REPO = Path(__file__).resolve().parents[1]


def test_list_reports_absent_datasets(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["list", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "mnist" in out and "absent" in out and "shakespeare" in out


def test_list_names_every_source_and_where_its_data_come_from(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    mark_complete(tmp_path, "mnist")
    assert main(["list", "--root", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [f"cache root: {tmp_path}", f"stand-in root: {tmp_path / 'standin'}"]
    assert lines[2].split()[:3] == ["dataset", "cache", "stand-in"]
    rows = {line.split()[0]: line for line in lines[3:]}
    assert sorted(rows) == SOURCES.names()
    assert rows["digits"].endswith(" bundled with scikit-learn")
    assert rows["synthetic"].endswith(" generated from the seed (dataset.seed)")
    assert rows["npz"].endswith(" your own .npz file (dataset.path)")
    assert rows["mnist"].split()[1:4] == ["present", "-", "verified"]
    assert rows["mnist"].endswith(" downloaded from ossci-datasets.s3.amazonaws.com")
    assert rows["cifar10"].split()[1:5] == ["absent", "-", "verified", "object(10)"]
    assert rows["cifar10"].endswith(" downloaded from www.cs.toronto.edu")
    assert rows["pneumonia"].split()[1:4] == ["absent", "-", "UNVERIFIED"]


def test_list_falls_back_to_the_source_docstring(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(raylf.datasets._LOCAL_ORIGINS, "digits")
    assert main(["list", "--root", str(tmp_path)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("digits "))
    assert row.endswith(" scikit-learn's bundled 8×8 handwritten digits (1,797 images): the "
                        "offline default.")


def test_describe_without_a_name_lists_presets(capsys: pytest.CaptureFixture) -> None:
    assert main(["describe"]) == 0
    out = capsys.readouterr().out
    assert "hdcfl-c100-a0.07" in out and "spcacw-shakespeare-n15-m7" in out and "note:" in out


def test_describe_preset_prints_table_and_plots(tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    standin.write("mnist", tmp_path)
    png = tmp_path / "dist.png"
    code = main(["describe", "spcacw-mnist-label-switch", "--root", str(tmp_path),
                 "--plot", str(png)])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == standin.notice("mnist", tmp_path / "mnist")
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["client", "group"])
    rows = [line.split() for line in lines[header + 1:header + 8]]
    assert [r[0] for r in rows] == [str(k) for k in range(7)]
    assert [r[1] for r in rows] == ["0", "1", "2", "0", "1", "2", "0"]
    assert sum(int(r[2]) + int(r[3]) for r in rows) == 1200  # the stand-in's 1,000 + 200
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_describe_spec_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    spec = REPO / "tune" / "examples" / "digits_label_skew.yaml"
    assert main(["describe", "--spec", str(spec), "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "scenario label_subset {'k': 2}" in out and "seed 3" in out
    rows = [line.split() for line in out.splitlines()[2:22]]
    assert all(r[4] == "2" for r in rows)  # two classes per client


def test_describe_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["describe", "c10-ls2"]) == 2
    assert "preset: unknown preset 'c10-ls2'" in capsys.readouterr().err
    assert main(["describe", "hdcfl-c10-ls2", "--root", str(tmp_path)]) == 1
    assert "python -m raylf.datasets fetch cifar10" in capsys.readouterr().err


def test_npz_end_to_end_through_the_run_cli(tmp_path: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(0)
    y = np.arange(400) % 10
    x = (rng.random((400, 8, 8)) * 40 + y[:, None, None] * 20).astype(np.uint8)
    np.savez(tmp_path / "mine.npz", x=x, y=y)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    cmd = [sys.executable, "-m", "raylf.run", "tune/examples/digits_label_skew.yaml",
           "--backend", "local", "--out", str(tmp_path / "out"), "--set", "dataset.name=npz",
           "--set", f"dataset.path={tmp_path / 'mine.npz'}", "--set", "federation.rounds=2",
           "--set", "eval_every=1"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "status ok" in done.stdout and "round    2/2" in done.stdout

    bad = cmd[3:-6] + ["--set", f"dataset.path={tmp_path / 'none.npz'}"]
    assert run_main([str(REPO / bad[0]), *bad[1:]]) == 2
    assert "dataset.path: Value error, no such file" in capsys.readouterr().err
