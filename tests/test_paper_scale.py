"""The paper-scale path before a cluster: plans without the data, cluster recipes at their
largest, smoke runs of every shipped spec on stand-ins, and cost estimates."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from raylf import results
from raylf.sweep import smoke as smoke_module
from raylf.sweep.recipes import cluster_recipe
from raylf.sweep.spec import load_sweep, searched_methods
from tests.test_sweep import ROOT, env, run_sweep

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
    from raylf.sweep.spec import load_sweep

    sweep, trials = load_sweep(ROOT / "tune" / "hdcfl_base.yaml")
    assert len(trials) == 1 and trials[0].spec.seed == 42 and sweep.name == "hdcfl"


def test_smoke_keeps_the_code_and_shrinks_the_work():
    """Seed, model, method, dataset and scenario stay; clients, participants, rounds and the
    bundle shape shrink; stand-in data go through dataset.root."""
    _, trials = load_sweep(ROOT / "tune" / "spcacw_mnist_rotation.yaml")
    spec = trials[0].spec
    small = smoke_module.shrink(spec, 2, "/somewhere")
    assert spec.federation.num_clients == 89 and small.federation.num_clients == 10
    assert small.federation.participants_per_round() == 2
    assert small.federation.rounds == 2 and small.eval_every == 2
    assert (small.model, small.method, small.scenario.name, small.seed) == \
        (spec.model, spec.method, spec.scenario.name, spec.seed)
    assert small.resources.workers == 2 and small.resources.cpus_per_worker == 0.25
    assert small.dataset_params.root == "/somewhere"


def smoke(tmp_path, specs):
    return subprocess.run(
        [sys.executable, "-m", "raylf.sweep", *map(str, specs), "--smoke", "--smoke-paths",
         "--smoke-rounds", "1", "--storage", str(tmp_path / "out"), "--num-cpus", "2",
         "--num-gpus", "1"], capture_output=True, text=True, timeout=1500, cwd=ROOT,
        env=env(RAYLF_DATA=str(tmp_path / "data"), TORCH_HOME=str(tmp_path / "torch")))


# the shipped specs by model size: two smoke sweeps, so that the suite's two workers share them
HEAVY = {"resnet18", "mobilenet_v2", "vgg16_cifar"}


def spec_models(path) -> set[str]:
    sweep, found = load_sweep(path)
    found += searched_methods(sweep, path.parent, str(path))[1] if sweep.searched else []
    return {t.spec.model.name for t in found}


def smoke_every_path(tmp_path, specs, downloaded: tuple[str, ...]):
    """Smoke-run ``specs`` in one sweep (one Ray start, trials two at a time), one configuration
    per code path, on the smoke stand-ins (no data here): every trial ends ok, every row on a
    downloaded dataset says stand-in, and so does the console; no trial leaves a personal state
    or a Tune checkpoint's file behind (they once filled the disk: VGG16's for 10 clients are
    860 MB a trial). Returns the trials table."""
    paths = set()
    for path in specs:
        sweep, found = load_sweep(path)
        found += searched_methods(sweep, path.parent, str(path))[1] if sweep.searched else []
        paths |= {smoke_module.code_path(t.spec) for t in found}
    proc = smoke(tmp_path, specs)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"smoke: {len(paths)} of {len(paths)} configuration(s) ran every round ok" in \
        proc.stdout
    for name in downloaded:
        assert f"STAND-IN DATA: {name}" in proc.stdout
    root = tmp_path / "out" / "smoke"
    trials = results.load(root)["trials"]
    assert len(trials) == len(paths) and set(trials["status"]) == {"ok"}
    on_downloads = trials["dataset"].isin(downloaded)
    assert set(trials.loc[on_downloads, "data_origin"]) == {"standin"}
    assert set(trials["dataset"]) >= set(downloaded)
    assert not [p for p in (root / "checkpoints").rglob("*") if p.is_file()]
    assert not list(root.rglob("checkpoint_*/*"))
    return trials


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_every_shipped_spec_of_mnist_scale_passes_its_smoke_run(tmp_path):
    """The digits, MNIST, Shakespeare and FMT-SVM specs (mlp, cnn, char_lstm models)."""
    specs = [p for p in SHIPPED if not spec_models(p) & HEAVY]
    assert len(specs) >= 12
    trials = smoke_every_path(tmp_path, specs, ("mnist", "shakespeare"))
    assert ("char_lstm", "shakespeare") in {tuple(r) for r in trials[["model", "dataset"]].values}


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_every_shipped_spec_of_cifar_scale_passes_its_smoke_run(tmp_path):
    """The paper-scale specs with their real models (ResNet-18 from stand-in ImageNet weights,
    MobileNetV2, VGG16) through the real CIFAR pickles and the real weight loading."""
    specs = [p for p in SHIPPED if spec_models(p) & HEAVY]
    assert len(specs) >= 8  # the HDC-FL specs and SP-CACW's CIFAR-100
    trials = smoke_every_path(tmp_path, specs, ("cifar10", "cifar100"))
    assert {("resnet18", "cifar10"), ("resnet18", "cifar100"), ("mobilenet_v2", "cifar10"),
            ("mobilenet_v2", "cifar100"), ("vgg16_cifar", "cifar100")
            } <= {tuple(r) for r in trials[["model", "dataset"]].values}
    pretrained = trials.dropna(subset=["model.weights"])
    assert set(pretrained["model"]) == {"resnet18", "mobilenet_v2"}
    assert pretrained["model.weights"].str.endswith("-imagenet-standin.pth").all()
