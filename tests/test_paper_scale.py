"""The paper-scale path before a cluster: plans without the data, cluster recipes at their
largest, smoke runs of every shipped spec on stand-ins, and cost estimates."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from raylf import results
from raylf.recipes import cluster_recipe
from tests.test_sweep import ROOT, run_sweep

SHIPPED = sorted((ROOT / "tune").glob("*.yaml"))


def test_plan_of_a_paper_sweep_needs_no_data(tmp_path):
    """hdcfl_main plans on a machine without CIFAR or the ImageNet weights: exit 0, the trial
    count, the fit on this machine and on the AWS recipe, and what to fetch with sizes."""
    proc = run_sweep(ROOT / "tune" / "hdcfl_main.yaml", tmp_path / "out", "--dry-run",
                     "--cluster", str(ROOT / "cluster" / "aws-gpu.yaml"),
                     RAYLF_DATA=str(tmp_path / "empty"), TORCH_HOME=str(tmp_path / "torch"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"^210 trials$", out, re.M)
    assert "recipe" in out and re.search(r"aws-gpu\.yaml at its largest.*: CPU 120, GPU 14; "
                                         r"14 trial\(s\) fit at once", out)
    for name, size in (("cifar10", "162.6 MiB"), ("cifar100", "161.2 MiB")):
        assert f"to fetch: {name}, {size}" in out and f"fetch {name} --root" in out
    assert "to fetch: resnet18 ImageNet weights, 44.7 MB" in out
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("recipe, nodes, most", [
    ("aws-gpu.yaml", {"head": 1, "gpu4": 2, "gpu1": 6}, {"CPU": 120.0, "GPU": 14.0}),
    ("gcp-gpu.yaml", {"head": 1, "gpu4_t4": 2, "gpu1_t4": 6}, {"CPU": 112.0, "GPU": 14.0}),
    ("kuberay-raycluster.yaml", {"head": 1, "gpu1": 8}, {"CPU": 32.0, "GPU": 8.0}),
])
def test_cluster_recipes_at_their_largest(recipe, nodes, most):
    """The global max_workers caps the node types, largest GPU nodes first (launcher files);
    KubeRay groups at maxReplicas with their container limits."""
    found = cluster_recipe(str(ROOT / "cluster" / recipe))
    assert found.nodes == nodes and found.most == most


def test_a_file_that_is_no_recipe_is_refused(tmp_path):
    from raylf.config import SpecError

    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump({"name": "not a cluster"}))
    with pytest.raises(SpecError, match="--cluster"):
        cluster_recipe(str(path))


def test_experiment_spec_runs_as_a_one_trial_sweep():
    from raylf.sweepspec import load_sweep

    sweep, trials = load_sweep(ROOT / "tune" / "hdcfl_base.yaml")
    assert len(trials) == 1 and trials[0].spec.seed == 42 and sweep.name == "hdcfl"
