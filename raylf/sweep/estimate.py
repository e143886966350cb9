"""Cost estimates (``python -m raylf.sweep SPEC --estimate``): time the first rounds of each
distinct configuration where the sweep would run, and extrapolate to the whole sweep before it
runs.

Each configuration runs a timing trial (its first seed, the spec's data, model, method,
resources and evaluation schedule, through the sweep's own runtime, as many at once as the
sweep would run, so neighbours slow it as they will) of R' = max(``--estimate-rounds``, R/10)
of its R rounds,
so that work a method does every few rounds (an evaluation, an epoch's α update, a refresh) is
in the sample in its own proportion. From the timing tables:

- ``fixed_s``: everything outside the rounds (data and partition, actors, model, a method's
  one-shot setup round 0) = the trial's ``wall_s`` minus its rounds' ``round_s``;
- ``rounds_s``: the timed rounds' ``round_s``, scaled by R / R';
- ``sweep_s``: the sweep runtime's own cost per trial (Tune, placement group, actor reuse) =
  the timed stage's wall × its concurrency minus its trials' ``wall_s``, per trial; the first
  trial of each
  bundle shape also starts that shape's actor processes, counted once per slot instead.

A trial then costs ``sweep_s + fixed_s + rounds_s``; every seed of a configuration costs the
same. Wall time at C trials at once is the longest-first schedule of all trials on C slots.
Device time is a trial's time × the GPUs it holds (CPU time likewise). What it leaves out:
checkpoint writes, ASHA stopping trials early, a cluster's nodes starting, and work that grows
with the round number; a search stage is costed at its budget (points × search seeds, then
top_k × seeds replicates) with the mean time of its probe configurations.
"""

from __future__ import annotations

import heapq
import json
import math
import statistics
from dataclasses import dataclass

from raylf import results
from raylf.config import ResolvedSpec, validate
from raylf.errors import SpecError
from raylf.experiment import default_trial_id
from raylf.raycluster import Capacity
from raylf.sweep.console import duration
from raylf.sweep.placement import concurrent_fit, describe_resources, trial_needs
from raylf.sweep.smoke import configuration, distinct, standin_inputs
from raylf.sweep.spec import SearchedMethod, Trial

ESTIMATE_ROUNDS = 3  # the least timed: round 1 also warms up


@dataclass(frozen=True)
class TimingRun:
    trials: list[Trial]  # the timing trials, one per configuration
    timed: dict[str, str]  # configuration → the id of the timing trial that costs it
    notes: list[str]
    borrowed: frozenset[str] = frozenset()  # configurations costed as another's timing trial


@dataclass(frozen=True)
class Cost:
    label: str
    trials: int
    fixed_s: float
    round_s: float  # a round on average over the timed ones
    trial_s: float  # one trial of this configuration, sweep runtime included
    gpus: float
    cpus: float
    timed: bool = True  # False: costed as another configuration's timing trial


@dataclass(frozen=True)
class Estimate:
    costs: list[Cost]
    startup_s: float  # starting a slot's actor processes, paid once per slot (not per trial)


def timed_rounds(spec: ResolvedSpec, rounds: int) -> int:
    """R' of the module docstring: at least ``rounds``, a tenth of a long run, never past R."""
    return min(spec.federation.rounds, max(rounds, math.ceil(spec.federation.rounds / 10)))


def timing_spec(spec: ResolvedSpec, rounds: int, dataset_root: str | None = None,
                weights: str | None = None) -> ResolvedSpec:
    """The configuration's timing trial: its first :func:`timed_rounds` rounds (reading
    ``dataset_root`` / ``weights`` instead of data and weights that are not here)."""
    raw = spec.to_dict()
    raw["federation"]["rounds"] = timed_rounds(spec, rounds)
    if dataset_root is not None:
        raw["dataset"]["root"] = dataset_root
    if weights is not None:
        raw["model"]["weights"] = weights
    return validate(raw)


def _without(spec: ResolvedSpec, *fields: str) -> str:
    """``spec`` but its seed and ``fields`` (a scenario keeps its validation share, which
    changes how much each client trains on)."""
    raw = {k: v for k, v in spec.to_dict().items() if k != "seed"}
    for field in fields:
        raw[field] = {"val_fraction": raw[field].get("val_fraction")} if field == "scenario" \
            else None
    return json.dumps(raw, sort_keys=True)


# what timing trials may be shared by, finest first: configurations that differ only in their
# scenario split the same data over the same clients with the same method, model, rounds and
# resources (they differ in how evenly the work falls on the workers); dropping the dataset too
# assumes datasets of like size and shape (CIFAR-10 and CIFAR-100: 50,000 3×32×32 images each)
SHARED_BY = (("configuration", lambda spec: _without(spec)),
             ("scenario", lambda spec: _without(spec, "scenario")),
             ("scenario and dataset", lambda spec: _without(spec, "scenario", "dataset")))


def timing_run(trials: list[Trial], rounds: int = ESTIMATE_ROUNDS, budget: int | None = None,
         standins: bool = True) -> TimingRun:
    """One timing trial per distinct configuration of ``trials``; with a ``budget`` of timing
    trials, one per class of the finest :data:`SHARED_BY` key with at most ``budget`` classes,
    costing every configuration of a class as its first. A dataset that is not fetched is read
    from its stand-in at the real size, ImageNet weights that are not in torch's hub cache
    from stand-in weights: a round's compute depends on how many samples of which shape and
    on the tensors' shapes, not on their content (``standins=False``, for a run that
    nothing: none are written, the data still to fetch are listed)."""
    configs = distinct(trials)
    level = 0
    if budget is not None:
        counts = [len({key(t.spec) for t in configs}) for _, key in SHARED_BY]
        fits = [i for i, count in enumerate(counts) if count <= budget]
        if not fits:
            raise SpecError([("--estimate-budget", (
                f"{budget} timing trial(s) cannot cover the {counts[-1]} configurations that "
                "differ in more than their scenario and dataset (method, model, federation, "
                f"resources); give at least {counts[-1]}"))])
        level = fits[0]
    what, key = SHARED_BY[level]
    inputs: dict[str, str] = {}
    timing, by_key, timed, borrowed = [], {}, {}, set()
    for trial in configs:
        spec = trial.spec
        if key(spec) in by_key:
            borrowed.add(configuration(spec))
        else:
            timing_trial = timing_spec(spec, rounds, *(
                standin_inputs(spec, "full", inputs) if standins else ()))
            timing.append(Trial(default_trial_id(timing_trial), timing_trial, trial.point))
            by_key[key(spec)] = timing[-1].trial_id
        timed[configuration(spec)] = by_key[key(spec)]
    notes = list(inputs.values())
    if inputs:
        notes.append("stand-ins hold as many samples of the same shapes as the real data, so "
                     "they cost the same compute; data-dependent work (a clustering that "
                     "converges sooner or later) may differ")
    if borrowed:
        notes.append(f"{len(borrowed)} of {len(timed)} configurations are not timed "
                     f"(--estimate-budget {budget}): each is costed as the timed configuration "
                     f"that differs from it only in its {what} (marked ~ below)")
    return TimingRun(timing, timed, notes, frozenset(borrowed))


def held(spec: ResolvedSpec, kind: str) -> float:
    """GPUs or CPUs one trial of ``spec`` holds: its bundles (``raylf.sweep.placement``), so a trial
    that trains in its own process counts no coordinator."""
    return trial_needs(spec).get(kind, 0.0)


def costs(root: str, estimate: TimingRun, trials: list[Trial], searches: list[SearchedMethod],
          probes: list[Trial], stage_wall_s: float, concurrency: int = 1,
          replicates: int = 0) -> Estimate:
    """Each configuration's cost per trial from its timing trial's tables (see module doc);
    ``replicates``: the trials each searched method replicates (top_k × seeds)."""
    loaded = results.load(root)
    walls = {r["trial_id"]: r["wall_s"] for r in loaded["trials"].to_dict("records")}
    rounds = loaded["rounds"]
    busy = sum(walls.get(t.trial_id, 0.0) for t in estimate.trials)
    sweep_s = max(0.0, (stage_wall_s * concurrency - busy) / len(estimate.trials))

    def parts(trial_id: str) -> tuple[float, float]:
        rows = rounds[(rounds["trial_id"] == trial_id) & (rounds["round"] >= 1)]
        times = rows["round_s"].tolist()
        if not times:
            raise RuntimeError(f"the timing trial {trial_id} recorded no round; see its error "
                               "in the trials table")
        return max(0.0, walls[trial_id] - sum(times)), statistics.fmean(times)

    timed = {t.trial_id: parts(t.trial_id) for t in estimate.trials}
    startup = 0.0
    # the first timing trial of each bundle shape also started that shape's actor processes
    # (torch imports and all), which a sweep pays once per slot, not per trial: the largest
    # fixed part of a shape is taken as its others' median, the excess as the start-up
    shapes: dict[tuple, list[str]] = {}
    for t in estimate.trials:
        r = t.spec.resources
        shape = (t.spec.active_workers(), r.cpus_per_worker,
                 r.gpus_per_worker, r.coordinator_cpus)
        shapes.setdefault(shape, []).append(t.trial_id)
    for ids in shapes.values():
        if len(ids) < 2:
            continue
        cold = max(ids, key=lambda i: timed[i][0])
        warm = statistics.median(timed[i][0] for i in ids if i != cold)
        startup = max(startup, timed[cold][0] - warm)
        timed[cold] = (min(timed[cold][0], warm),) + timed[cold][1:]

    def cost(spec: ResolvedSpec) -> tuple[float, float, float]:
        fixed, per_round = timed[estimate.timed[configuration(spec)]]
        return fixed, per_round, sweep_s + fixed + spec.federation.rounds * per_round

    by_config: dict[str, list[Trial]] = {}
    for trial in trials:
        by_config.setdefault(configuration(trial.spec), []).append(trial)
    out = []
    for group in by_config.values():
        spec = group[0].spec
        fixed, per_round, total = cost(spec)
        out.append(Cost(f"{spec.name} · {group[0].label.rsplit(' seed=', 1)[0]}", len(group),
                        fixed, per_round, total, held(spec, "GPU"), held(spec, "CPU"),
                        configuration(spec) not in estimate.borrowed))
    for search in searches:  # stage 1 at its budget, stage 2 at top_k × seeds, at the probes' mean
        mine = [p for p in probes if p.spec.method.name == search.entry.name]
        each = statistics.fmean(cost(p.spec)[2] for p in mine)
        spec = mine[0].spec
        for stage, count in (("search", search.points * len(search.seeds)),
                             ("replicates", replicates)):
            out.append(Cost(f"{spec.name} · {search.entry.name} ({stage})", count, 0.0, 0.0,
                            each, held(spec, "GPU"), held(spec, "CPU")))
    return Estimate(out, startup)


def makespan(durations: list[float], slots: int) -> float:
    """Wall time of running ``durations`` longest first on ``slots`` parallel slots."""
    ends = [0.0] * max(1, slots)
    for d in sorted(durations, reverse=True):
        heapq.heapreplace(ends, ends[0] + d)
    return max(ends)


def render(estimate: Estimate, where: str, concurrency: list[tuple[str, int]]) -> str:
    """The estimate as the console prints it."""
    costs_ = estimate.costs
    lines = [f"estimate, timed on {where}:",
             f"  {'configuration':<58} {'trials':>6} {'fixed s':>8} {'s/round':>8} "
             f"{'per trial':>10}"]
    for c in costs_:
        mark = " " if c.timed else "~"
        lines.append(f" {mark}{c.label[:58]:<58} {c.trials:>6} {c.fixed_s:>8.2f} "
                     f"{c.round_s:>8.3f} {duration(c.trial_s):>10}")
    count = sum(c.trials for c in costs_)
    gpu_h = sum(c.trial_s * c.gpus * c.trials for c in costs_) / 3600
    cpu_h = sum(c.trial_s * c.cpus * c.trials for c in costs_) / 3600
    lines.append(f"starting the actor processes: {estimate.startup_s:.1f} s once per slot")
    lines.append(f"total: {count} trials, {gpu_h:.2f} GPU-hours, {cpu_h:.2f} CPU-hours "
                 f"(trial time × the GPUs / CPUs each trial holds)")
    durations = [c.trial_s for c in costs_ for _ in range(c.trials)]
    for name, slots in concurrency:
        wall = makespan(durations, slots) + estimate.startup_s if slots else float("inf")
        lines.append(f"wall {name}: {slots} trial(s) at once → "
                     f"{duration(wall) if slots else 'never (a trial does not fit)'}")
    return "\n".join(lines)


def summary(root: str, loaded, stage_wall_s: float, cluster: Capacity, where: str,
            recipe) -> str:
    """The estimate of the spec's sweep from the timing trials just run (``loaded``: the
    estimate run's ``raylf.sweep.load.Loaded``)."""
    sweep, trials, searches, probes = loaded.original
    sizing = trials + probes
    here = sweep.max_concurrent or (concurrent_fit(sizing, cluster.most) if cluster.most
                                    else len(sizing))
    timed_at = loaded.sweep.max_concurrent or min(here, len(loaded.trials))
    estimated = costs(root, loaded.mode, trials, searches, probes, stage_wall_s, timed_at,
                      replicates=sweep.top_k * len(sweep.seeds))
    slots = [("at the spec's concurrency" if sweep.max_concurrent else f"on {where}", here)]
    if recipe is not None:
        slots.append((f"on {recipe.where}", concurrent_fit(sizing, recipe.most)))
    machine = f"{where} ({describe_resources(cluster.now)})"
    return render(estimated, machine, slots) + (
        "\n(trial times are this machine's: on other hardware, run --estimate there, e.g. as a "
        "Ray job on the cluster)" if recipe is not None else "")
