"""Every notebook under notebooks/ runs top to bottom (code cells in order, headless plots)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch):
    matplotlib.use("Agg")
    monkeypatch.chdir(path.parent)
    monkeypatch.delenv("RAYLF_RESULTS", raising=False)
    namespace: dict = {}
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), f"{path.name}", "exec"), namespace)
    tables = namespace["tables"]
    assert len(tables["trials"]) == 2
    assert set(namespace["summary"].index) == {"fedavg", "fedavg_se"}


def test_there_are_notebooks():
    assert NOTEBOOKS
