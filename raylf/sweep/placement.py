"""Where a sweep's trials run: the placement-group bundles each trial reserves, whether every trial
fits the cluster (Tune would leave one that never fits pending forever), how many fit at once,
and what the console says of it."""

from __future__ import annotations

import json

from raylf.config import ResolvedSpec
from raylf.errors import SpecError
from raylf.raycluster import Capacity
from raylf.runtime.ray_backend import bundles
from raylf.sweep.spec import SweepSpec, Trial

TRIAL_CPUS = 0.25  # bundle 0: the trial function, which drives rounds and writes tables


def trains_inline(spec: ResolvedSpec) -> bool:
    """Whether a trial trains in its trial function's own process (``raylf.runtime.inline``):
    with one worker there is nothing for actors to spread, only a hop to pay."""
    return spec.active_workers() == 1


def trial_bundles(spec: ResolvedSpec) -> list[dict[str, float]]:
    """Bundle 0 for the trial function (Tune runs it there), the coordinator's, then one per
    client worker; an inline trial's one bundle holds its worker's resources as well."""
    if trains_inline(spec):
        (worker,) = bundles(spec.resources, 1)[1:]
        return [worker | {"CPU": TRIAL_CPUS + worker["CPU"]}]
    return [{"CPU": TRIAL_CPUS}] + bundles(spec.resources, spec.active_workers())


def trial_needs(spec: ResolvedSpec) -> dict[str, float]:
    """CPUs and GPUs one trial of ``spec`` holds: the sum of its bundles."""
    need: dict[str, float] = {}
    for bundle in trial_bundles(spec):
        for kind, amount in bundle.items():
            need[kind] = need.get(kind, 0) + amount
    return need


def concurrent_fit(trials: list[Trial], total: dict[str, float]) -> int:
    """How many of the largest trial fit in the cluster's totals at once (0 = never)."""
    worst = max((trial_needs(t.spec) for t in trials), key=lambda n: sorted(n.items()))
    return min(int(total.get(kind, 0) // amount + 1e-9) for kind, amount in worst.items())


def check_placement(trials: list[Trial], total: dict[str, float]) -> None:
    """Every trial's bundles fit the cluster's totals (Tune would leave it pending forever)."""
    problems = set()
    for trial in trials:
        for kind, amount in trial_needs(trial.spec).items():
            if amount > total.get(kind, 0) + 1e-9:
                field = "resources.gpus_per_worker" if kind == "GPU" else "resources"
                fix = ("set resources.gpus_per_worker=0 to train on CPUs, or declare GPUs "
                       "(--num-gpus N, ray start --num-gpus N)" if kind == "GPU" and
                       not total.get("GPU") else
                       "lower resources.workers or the per-worker resources, or use a larger "
                       "cluster")
                problems.add((field, (
                    f"one trial needs {amount:g} {kind} ({trial_bundles(trial.spec)}), the Ray "
                    f"cluster has {total.get(kind, 0):g}; {fix}")))
    if problems:
        raise SpecError(sorted(problems))


def describe_resources(total: dict[str, float]) -> str:
    """The CPUs and GPUs of ``total`` as the console writes them."""
    return ", ".join(f"{k} {v:g}" for k, v in sorted(total.items()) if k in ("CPU", "GPU"))


def describe_placement(sweep: SweepSpec, trials: list[Trial], cluster: Capacity,
                  where: str, listing: bool = True) -> list[str]:
    """The placement: trial count (and, with ``listing``, every trial), bundles and how many fit."""
    points = len({(t.spec.method.name, json.dumps(t.point, sort_keys=True)) for t in trials})
    lines = [f"{len(trials)} trials" if listing else
             f"sweep {sweep.name}: {len(trials)} trials ({points} method/grid points × "
             f"{len(sweep.seeds)} seed{'' if len(sweep.seeds) == 1 else 's'})"]
    if listing:
        lines += [f"  {t.trial_id}  {t.label}" for t in trials]
    return lines + resource_lines(sweep, trials, cluster, where)


def resource_lines(sweep: SweepSpec, trials: list[Trial], cluster: Capacity,
                   where: str) -> list[str]:
    """Bundles per trial and how many of the largest fit the cluster at once (on an autoscaling
    cluster: once it has grown)."""
    cap = sweep.max_concurrent
    if cluster.most is None:
        fit = "an autoscaler adds nodes while trials wait for them"
    else:
        grows = (f", up to {describe_resources(cluster.most)} by autoscaling"
                 if cluster.autoscaling else "")
        fit = f"{concurrent_fit(trials, cluster.most)} trial(s) fit at once{grows}"
    first = trials[0].spec
    return [f"bundles per trial: {trial_bundles(first)} (" + (
                "the trial function, which trains its one worker's clients itself" if
                trains_inline(first) else "trial function, coordinator, one per client worker")
            + ")",
            f"cluster ({where}): {describe_resources(cluster.now) or 'no resources'}; {fit}" +
            (f", capped at {cap} by max_concurrent" if cap else "")]

