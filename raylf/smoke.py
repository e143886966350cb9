"""Smoke runs (``python -m raylf.sweep SPEC... --smoke``): every distinct configuration of a
sweep, one seed, for a couple of rounds, on this machine, before a cluster is paid for.

A paper-scale spec that breaks in round 1 (a shape, a dtype, a field, a method's code at that
model) should break on a laptop in minutes, not after the GPUs are rented. A smoke trial keeps
what decides whether a configuration runs — its dataset's on-disk format and loader, the
scenario and client count, the model, the method and its parameters, the data layout over
workers, GPU shares — and shrinks only what decides how long it runs:

- one seed per configuration (seeds do not change code paths);
- ``federation.rounds`` capped (default 2: the second round runs on state the first left), every
  round an evaluation round, so evaluation, per-round diagnostics and the last round's full
  evaluation all run;
- resources shrunk to fit one machine: at most 2 workers of 0.25 CPU, a 0.25 GPU share where
  the spec asks for GPUs (the same bundle shape for every trial, so actors are reused);
- data: a downloaded dataset that is not in the cache is replaced by its format-true stand-in
  (:mod:`raylf.data.standin`), written once and read through the real fetch, verify and load
  path. Every table row and console line of such a trial says stand-in.

What a smoke run cannot show: memory and time at full size (``--estimate`` measures time), a
method's behaviour past the capped rounds (e.g. an HDC-FL refresh scheduled later than round 2
with an explicit ``activation``), and anything about accuracy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from raylf.config import ExperimentSpec, validate
from raylf.experiment import default_trial_id
from raylf.sweepspec import Trial

SMOKE_ROUNDS = 2
SMOKE_WORKERS = 2
SMOKE_CPUS = 0.25
SMOKE_GPU_SHARE = 0.25


@dataclass(frozen=True)
class SmokePlan:
    trials: list[Trial]
    notes: list[str]  # what was replaced by a stand-in, for the console


# torchvision builders of the models whose ``model.weights: imagenet`` smoke runs replace
PRETRAINED = {"resnet18": "ResNet18_Weights", "mobilenet_v2": "MobileNet_V2_Weights"}


def configuration(spec: ExperimentSpec) -> str:
    """A trial's configuration: its whole spec but the seed (what a smoke run runs once)."""
    return json.dumps({k: v for k, v in spec.to_dict().items() if k != "seed"}, sort_keys=True)


def distinct(trials: list[Trial]) -> list[Trial]:
    """The first trial of every configuration, in order."""
    seen: dict[str, Trial] = {}
    for trial in trials:
        seen.setdefault(configuration(trial.spec), trial)
    return list(seen.values())


def shrink(spec: ExperimentSpec, rounds: int = SMOKE_ROUNDS, dataset_root: str | None = None,
           weights: str | None = None) -> ExperimentSpec:
    """The smoke version of one trial's spec (see the module docstring for what changes);
    ``dataset_root`` / ``weights`` point the spec at stand-in data / pretrained weights."""
    raw = spec.to_dict()
    raw["federation"]["rounds"] = min(spec.federation.rounds, rounds)
    raw["eval_every"] = 1
    res = raw["resources"]
    res["workers"] = min(spec.resources.workers, SMOKE_WORKERS)
    res["cpus_per_worker"] = SMOKE_CPUS
    res["coordinator_cpus"] = SMOKE_CPUS
    res["gpus_per_worker"] = SMOKE_GPU_SHARE if spec.resources.gpus_per_worker else 0.0
    if dataset_root is not None:
        raw["dataset"]["root"] = dataset_root
    if weights is not None:
        raw["model"]["weights"] = weights
    return validate(raw)


def hub_file(model: str) -> Path:
    """Where torchvision keeps the ImageNet weights of ``model`` (torch's hub cache)."""
    import torch
    import torchvision.models as tvm

    url = getattr(tvm, PRETRAINED[model]).IMAGENET1K_V1.url
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(url).name


def standin_weights(model: str, folder: Path) -> str:
    """A state dict of the torchvision ``model`` with seeded random tensors, saved as torch
    saves the real file, so ``model.weights`` loads through the real path (names and shapes
    matched, the adapted stem and the head left to the seeded init)."""
    import torch
    import torchvision.models as tvm

    path = folder / f"{model}-imagenet-standin.pth"
    if not path.is_file():
        torch.manual_seed(0)
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        torch.save(tvm.get_model(model, weights=None).state_dict(), partial)
        partial.replace(path)
    return str(path)


def plan(trials: list[Trial], rounds: int = SMOKE_ROUNDS) -> SmokePlan:
    """One shrunk trial per distinct configuration; datasets absent from the cache replaced by
    their stand-ins, ImageNet weights absent from torch's hub cache by stand-in weights (each
    written once, on first use)."""
    from raylf.data import standin

    notes: dict[str, str] = {}
    out = []
    for trial in distinct(trials):
        spec = trial.spec
        root = standin.root_for(spec.dataset.name, spec.dataset.params)
        if root is not None:
            notes[spec.dataset.name] = (f"{spec.dataset.name} is not fetched: its stand-in at "
                                        f"{root} (random content, the real file format)")
        weights = None
        if getattr(spec.model.params, "weights", None) == "imagenet" and \
                spec.model.name in PRETRAINED and not hub_file(spec.model.name).is_file():
            weights = standin_weights(spec.model.name, standin.standin_root() / "weights")
            notes[spec.model.name] = (f"{spec.model.name} ImageNet weights are not in torch's "
                                      f"hub cache ({hub_file(spec.model.name)}): stand-in "
                                      f"weights {weights} (random tensors, the real layout)")
        small = shrink(spec, rounds, root, weights)
        out.append(Trial(default_trial_id(small), small, trial.point))
    return SmokePlan(out, list(notes.values()))
