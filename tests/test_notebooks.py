"""Every notebook under notebooks/ runs top to bottom in a Jupyter kernel (nbclient) on a tiny
sweep's tables, the directory passed as ``RAYLF_RESULTS``; the repository keeps them without
outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.test_report import make_synthetic_sweep, make_tiny_sweep

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
# what each notebook must print for the tiny sweep (its methods, its tables' headers)
EXPECTED = {
    "01_quickstart.ipynb": ["fedavg_se", "Avg. rank ↓"],
    "02_paper_tables.ipynb": ["Avg. rank", "Tail rank", "validation-selected", "diverged"],
    "03_hdcfl_diagnostics.ipynb": ["diagnostic columns: none in these tables", "latent groups"],
    "04_fmtsvm_privacy.ipynb": ["ε composed (all rounds)", "multiclass AUC", "KB up"],
}


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory) -> str:
    return make_tiny_sweep(tmp_path_factory.getbasetemp() / "tiny-sweep")


def execute(path: Path, results_dir: str, monkeypatch) -> tuple[str, int]:
    """Run the notebook; return the text of all its outputs and how many images it drew."""
    monkeypatch.setenv("RAYLF_RESULTS", results_dir)
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK_DIR)}}).execute()
    texts, images = [], 0
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            texts.append(output.get("text", ""))
            data = output.get("data", {})
            texts += [data.get("text/plain", ""), data.get("text/markdown", "")]
            images += "image/png" in data
    return "\n".join(texts), images


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_on_a_tiny_sweep(path, tiny_sweep, monkeypatch):
    text, images = execute(path, tiny_sweep, monkeypatch)
    for expected in EXPECTED[path.name]:
        assert expected in text, f"{path.name} does not show {expected!r}"
    assert images >= 1


def test_diagnostics_notebook_plots_grouping_diagnostics(tmp_path, monkeypatch):
    root = make_synthetic_sweep(tmp_path / "sweep")
    text, images = execute(NOTEBOOK_DIR / "03_hdcfl_diagnostics.ipynb", root, monkeypatch)
    assert "diagnostic columns: ['silhouette', 'ari_latent', 'membership_entropy']" in text
    assert images == 2  # diagnostics over rounds, accuracy by latent group


def test_notebooks_are_stored_without_outputs():
    assert {p.name for p in NOTEBOOKS} == set(EXPECTED)
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, path.name
