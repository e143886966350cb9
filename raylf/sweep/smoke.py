"""Smoke runs (``python -m raylf.sweep SPEC... --smoke``): every distinct configuration of a
sweep, one seed, for a couple of rounds, on this machine, before a cluster is paid for.

A paper-scale spec that breaks in round 1 (a shape, a dtype, a field, a method's code at that
model) should break on a laptop in minutes, not after the GPUs are rented. A smoke trial keeps
what decides whether a configuration runs — its dataset's on-disk format and loader, the
scenario and client count, the model, the method and its parameters, the data layout over
workers, GPU shares — and shrinks only what decides how long it runs:

- one seed per configuration (seeds do not change code paths);
- few clients: at most 10 (``SMOKE_CLIENTS``), 2 of them training per round, on the scenario the
  spec names; ``federation.rounds`` capped (default 2: the second round runs on state the first
  left) and ``local_epochs`` to 1, the last round evaluating every client;
- a method's own caps on parameters that count extra work (``Method.smoke_params``: FedALA's
  first adaptive passes, FedBABU's fine-tuning epochs);
- resources shrunk to fit one machine: 2 workers of 0.25 CPU, a 0.25 GPU share where the spec
  asks for GPUs (one bundle shape per device kind, so actors are reused from trial to trial);
- data: a downloaded dataset that is not in the cache is replaced by its format-true stand-in
  at the ``smoke`` size (:mod:`raylf.data.standin`: e.g. 15 CIFAR-10 images per class, so a
  ResNet-18 trains seconds per trial on a CPU), written once and read through the real fetch,
  verify and load path. Every table row and console line of such a trial says stand-in. A
  generated dataset makes at most ``SMOKE_SAMPLES`` samples.

What a smoke run cannot show: partitions at the spec's client count (``--dry-run`` builds every
trial's once the data are there), memory and time at full size (``--estimate`` measures time),
a method's behaviour past the capped rounds (e.g. an HDC-FL refresh scheduled later than round 2
with an explicit ``activation``), and anything about accuracy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from raylf import results
from raylf.config import ResolvedSpec, validate
from raylf.experiment import default_trial_id
from raylf.sweep.console import last_line
from raylf.sweep.spec import Trial

SMOKE_ROUNDS = 2
SMOKE_CLIENTS = 10
SMOKE_SAMPLES = 1000  # images a generated dataset (digits28, synthetic) makes for a smoke run
SMOKE_PARTICIPANTS = 2
SMOKE_WORKERS = 2
SMOKE_CPUS = 0.25
SMOKE_GPU_SHARE = 0.25


@dataclass(frozen=True)
class SmokeRun:
    trials: list[Trial]
    notes: list[str]  # what was replaced by a stand-in, for the console


# torchvision builders of the models whose ``model.weights: imagenet`` smoke runs replace
PRETRAINED = {"resnet18": "ResNet18_Weights", "mobilenet_v2": "MobileNet_V2_Weights"}


def configuration(spec: ResolvedSpec) -> str:
    """A trial's configuration: its whole spec but the seed (what a smoke run runs once)."""
    return json.dumps({k: v for k, v in spec.to_dict().items() if k != "seed"}, sort_keys=True)


def code_path(spec: ResolvedSpec) -> str:
    """What decides which code a trial trains and evaluates with: the method and its parameters
    that are not numbers, the model and the dataset (its input shape and classes). Numbers
    (learning rates, α, k, seeds, round counts) change results, not code paths; scenarios
    change the data a client holds, which the code reads the same way (a path's first
    configuration brings its own scenario)."""
    def words(tree):
        if isinstance(tree, dict):
            return {k: words(v) for k, v in sorted(tree.items())
                    if not isinstance(v, (int, float)) or isinstance(v, bool)}
        return tree

    return json.dumps({"method": spec.method.name,
                       "params": words(spec.method_params.model_dump(mode="json")),
                       "model": spec.model.model_dump(mode="json"),
                       "dataset": spec.dataset.name},
                      sort_keys=True)


def distinct(trials: list[Trial], key=configuration) -> list[Trial]:
    """The first trial of every configuration (or of every ``key``), in order."""
    seen: dict[str, Trial] = {}
    for trial in trials:
        seen.setdefault(key(trial.spec), trial)
    return list(seen.values())


def shrink(spec: ResolvedSpec, rounds: int = SMOKE_ROUNDS, dataset_root: str | None = None,
           weights: str | None = None) -> ResolvedSpec:
    """The smoke version of one trial's spec (see the module docstring for what changes);
    ``dataset_root`` / ``weights`` point the spec at stand-in data / pretrained weights."""
    raw = spec.to_dict()
    clients = min(spec.federation.num_clients, SMOKE_CLIENTS)
    raw["federation"]["num_clients"] = clients
    raw["federation"]["rounds"] = min(spec.federation.rounds, rounds)
    raw["federation"]["local_epochs"] = 1
    generated = getattr(spec.dataset_params, "n_samples", None)  # digits28, synthetic
    if generated is not None:
        raw["dataset"]["n_samples"] = min(generated, SMOKE_SAMPLES)
    raw["federation"]["participation"] = min(spec.federation.participation,
                                             SMOKE_PARTICIPANTS / clients)
    raw["eval_every"] = raw["federation"]["rounds"]
    params = spec.method_params.model_dump()
    for name, cap in spec.method_class.smoke_params.items():
        if params[name] > cap:
            raw["method"]["params"][name] = cap
    res = raw["resources"]
    res["workers"] = min(clients, SMOKE_WORKERS)  # one bundle shape: actors are reused
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


def standin_inputs(spec: ResolvedSpec, size: str, notes: dict[str, str]
                   ) -> tuple[str | None, str | None]:
    """Where ``spec`` reads data and pretrained weights from when they are not here: the
    stand-in root of its dataset at ``size`` (None when the dataset is fetched or generated) and
    stand-in weights (None when the real ones are in torch's hub cache or none are named), each
    written once, on first use; ``notes`` gets the console line saying so."""
    from raylf.data import standin

    root = standin.root_for(spec.dataset.name, spec.dataset_params, size=size)
    if root is not None:
        notes[spec.dataset.name] = (f"{spec.dataset.name} is not fetched: its stand-in at "
                                    f"{root} (random content, the real file format)")
    weights = None
    if getattr(spec.model_params, "weights", None) == "imagenet" and \
            spec.model.name in PRETRAINED and not hub_file(spec.model.name).is_file():
        weights = standin_weights(spec.model.name, standin.standin_root() / "weights")
        notes[spec.model.name] = (f"{spec.model.name} ImageNet weights are not in torch's "
                                  f"hub cache ({hub_file(spec.model.name)}): stand-in "
                                  f"weights {weights} (random tensors, the real layout)")
    return root, weights


def smoke_run(trials: list[Trial], rounds: int = SMOKE_ROUNDS, paths: bool = False) -> SmokeRun:
    """One shrunk trial per distinct configuration; datasets absent from the cache replaced by
    their stand-ins, ImageNet weights absent from torch's hub cache by stand-in weights (each
    written once, on first use). ``paths``: one trial per :func:`code_path` instead."""
    notes: dict[str, str] = {}
    out = []
    for trial in distinct(trials, code_path if paths else configuration):
        small = shrink(trial.spec, rounds, *standin_inputs(trial.spec, "smoke", notes))
        out.append(Trial(default_trial_id(small), small, trial.point))
    # trials of one bundle shape back to back: Tune reuses a trial's actors only for the next
    # trial of the same bundles, and starting an actor costs a torch import
    out.sort(key=lambda t: t.spec.resources.gpus_per_worker)
    return SmokeRun(out, list(notes.values()))


def summary(root: str, trials: list[Trial]) -> str:
    """How many configurations ran their smoke rounds, and the ones that did not, each with
    its reason (the tables hold the rest)."""
    table = results.read_table(root, "trials")
    rows = {r["trial_id"]: r for r in (table.to_pylist() if table is not None else [])}
    bad = [(t, rows.get(t.trial_id)) for t in trials
           if (rows.get(t.trial_id) or {}).get("status") != "ok"]
    lines = [f"smoke: {len(trials) - len(bad)} of {len(trials)} configuration(s) ran every "
             f"round ok (tables: {root}/tables/)"]
    for trial, row in bad:
        status = row["status"] if row else "no result"
        reason = last_line(row.get("error")) if row else "the trial wrote no row"
        lines.append(f"  {status}: {trial.spec.name} {trial.label}: {reason}")
    return "\n".join(lines)
