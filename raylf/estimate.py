"""Cost estimates (``python -m raylf.sweep SPEC --estimate``): time a few rounds of each distinct
configuration where the sweep would run, and extrapolate to the whole sweep before it runs.

A trial's time is measured in parts, each from the timing tables of a short real trial of the
configuration (first seed, the spec's data, model, method and resources, through the sweep's
own runtime, one trial at a time so the parts are not inflated by neighbours):

- ``fixed_s``: everything outside the rounds (data and partition, actors, model, a method's
  one-shot setup round 0) = the trial's ``wall_s`` minus its rounds' ``round_s``;
- ``train_s``: a round without evaluation (the median of the timed ones after the first, which
  pays for warm-up, or the first when it is the only one);
- ``eval_s``: what evaluating every client adds (the last timed round evaluates, the others do
  not; the difference to ``train_s``);
- ``sweep_s``: the sweep runtime's own cost per trial (Tune, placement group, actor reuse) =
  the timed stage's wall minus its trials' ``wall_s``, per trial.

A trial of R rounds that evaluates E times then costs ``sweep_s + fixed_s + R·train_s +
E·eval_s``; every seed of a configuration costs the same. Wall time at C trials at once is the
longest-first schedule of all trials on C slots. Device time is a trial's time × the GPUs it
holds (CPU time likewise). What it leaves out: checkpoint writes, ASHA stopping trials early,
and a cluster's nodes starting; a search stage is costed at its budget (points × search seeds,
then top_k × seeds replicates) with the mean time of its probe configurations.
"""

from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass

from raylf import results
from raylf.config import ExperimentSpec, validate
from raylf.experiment import default_trial_id
from raylf.smoke import configuration, distinct
from raylf.sweepspec import SearchPlan, Trial

ESTIMATE_ROUNDS = 3  # round 1 warms up, round 2 is a plain round, round 3 adds the evaluation


@dataclass(frozen=True)
class EstimatePlan:
    trials: list[Trial]  # the timing trials, one per configuration
    timed: dict[str, str]  # configuration → its timing trial's id
    notes: list[str]


@dataclass(frozen=True)
class Cost:
    label: str
    trials: int
    fixed_s: float
    train_s: float
    eval_s: float
    trial_s: float  # one trial of this configuration, sweep runtime included
    gpus: float
    cpus: float


@dataclass(frozen=True)
class Estimate:
    costs: list[Cost]
    startup_s: float  # starting a slot's actor processes, paid once per slot (not per trial)


def timing_spec(spec: ExperimentSpec, rounds: int) -> ExperimentSpec:
    """The configuration's timing trial: its first ``rounds`` rounds (more for a long run of
    short rounds, up to 1/20 of them and at most 20, so the median round is not one sample),
    only the last evaluating."""
    raw = spec.to_dict()
    timed = min(spec.federation.rounds, max(rounds, min(20, spec.federation.rounds // 20)))
    raw["federation"]["rounds"] = timed
    raw["eval_every"] = timed
    return validate(raw)


def plan(trials: list[Trial], rounds: int = ESTIMATE_ROUNDS) -> EstimatePlan:
    """One timing trial per distinct configuration of ``trials``."""
    timing, timed = [], {}
    for trial in distinct(trials):
        spec = timing_spec(trial.spec, rounds)
        timing.append(Trial(default_trial_id(spec), spec, trial.point))
        timed[configuration(trial.spec)] = timing[-1].trial_id
    return EstimatePlan(timing, timed, [])


def held(spec: ExperimentSpec, kind: str) -> float:
    """GPUs or CPUs one trial of ``spec`` holds (its client workers and coordinator)."""
    workers = min(spec.resources.workers, spec.federation.num_clients)
    if kind == "GPU":
        return workers * spec.resources.gpus_per_worker
    return workers * spec.resources.cpus_per_worker + spec.resources.coordinator_cpus


def evaluations(spec: ExperimentSpec) -> int:
    return sum(spec.evaluates(r) for r in range(1, spec.federation.rounds + 1))


def costs(root: str, estimate: EstimatePlan, trials: list[Trial], plans: list[SearchPlan],
          probes: list[Trial], stage_wall_s: float, replicates: int = 0) -> Estimate:
    """Each configuration's cost per trial from its timing trial's tables (see module doc);
    ``replicates``: the trials each searched method replicates (top_k × seeds)."""
    loaded = results.load(root)
    walls = {r["trial_id"]: r["wall_s"] for r in loaded["trials"].to_dict("records")}
    rounds = loaded["rounds"]
    sweep_s = max(0.0, (stage_wall_s - sum(walls.get(t.trial_id, 0.0)
                                           for t in estimate.trials)) / len(estimate.trials))

    def parts(trial_id: str) -> tuple[float, float, float]:
        rows = rounds[(rounds["trial_id"] == trial_id) & (rounds["round"] >= 1)]
        times = rows.sort_values("round")["round_s"].tolist()
        if not times:
            raise RuntimeError(f"the timing trial {trial_id} recorded no round; see its error "
                               "in the trials table")
        plain = times[1:-1] or times[:1]
        train = statistics.median(plain)
        evaluate = max(0.0, times[-1] - train) if len(times) > 1 else 0.0
        return max(0.0, walls[trial_id] - sum(times)), train, evaluate

    timed = {t.trial_id: parts(t.trial_id) for t in estimate.trials}
    startup = 0.0
    # the first timing trial of each bundle shape also started that shape's actor processes
    # (torch imports and all), which a sweep pays once per slot, not per trial: the largest
    # fixed part of a shape is taken as its others' median, the excess as the start-up
    shapes: dict[tuple, list[str]] = {}
    for t in estimate.trials:
        r = t.spec.resources
        shape = (min(r.workers, t.spec.federation.num_clients), r.cpus_per_worker,
                 r.gpus_per_worker, r.coordinator_cpus)
        shapes.setdefault(shape, []).append(t.trial_id)
    for ids in shapes.values():
        if len(ids) < 2:
            continue
        cold = max(ids, key=lambda i: timed[i][0])
        warm = statistics.median(timed[i][0] for i in ids if i != cold)
        startup = max(startup, timed[cold][0] - warm)
        timed[cold] = (min(timed[cold][0], warm),) + timed[cold][1:]

    def measured(trial_id: str) -> tuple[float, float, float]:
        return timed[trial_id]

    by_config: dict[str, list[Trial]] = {}
    for trial in trials:
        by_config.setdefault(configuration(trial.spec), []).append(trial)
    out = []
    for key, group in by_config.items():
        spec = group[0].spec
        fixed, train, evaluate = measured(estimate.timed[key])
        total = sweep_s + fixed + spec.federation.rounds * train + evaluations(spec) * evaluate
        out.append(Cost(f"{spec.name} · {group[0].label.rsplit(' seed=', 1)[0]}", len(group),
                        fixed, train, evaluate, total, held(spec, "GPU"), held(spec, "CPU")))
    for search in plans:  # stage 1 at its budget, stage 2 at top_k × seeds, at the probes' mean
        mine = [p for p in probes if p.spec.method.name == search.entry.name]
        each = statistics.fmean(
            sweep_s + fixed + p.spec.federation.rounds * train + evaluations(p.spec) * evaluate
            for p in mine
            for fixed, train, evaluate in [measured(estimate.timed[configuration(p.spec)])])
        spec = mine[0].spec
        for stage, count in (("search", search.points * len(search.seeds)),
                             ("replicates", replicates)):
            out.append(Cost(f"{spec.name} · {search.entry.name} ({stage})", count, 0.0, 0.0,
                            0.0, each, held(spec, "GPU"), held(spec, "CPU")))
    return Estimate(out, startup)


def makespan(durations: list[float], slots: int) -> float:
    """Wall time of running ``durations`` longest first on ``slots`` parallel slots."""
    ends = [0.0] * max(1, slots)
    for d in sorted(durations, reverse=True):
        heapq.heapreplace(ends, ends[0] + d)
    return max(ends)


def render(estimate: Estimate, where: str, concurrency: list[tuple[str, int]]) -> str:
    """The estimate as the console prints it."""
    from raylf.sweep import _duration

    costs_ = estimate.costs
    lines = [f"estimate, timed on {where}:",
             f"  {'configuration':<58} {'trials':>6} {'fixed s':>8} {'s/round':>8} "
             f"{'eval s':>7} {'per trial':>10}"]
    for c in costs_:
        lines.append(f"  {c.label[:58]:<58} {c.trials:>6} {c.fixed_s:>8.2f} {c.train_s:>8.3f} "
                     f"{c.eval_s:>7.3f} {_duration(c.trial_s):>10}")
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
                     f"{_duration(wall) if slots else 'never (a trial does not fit)'}")
    return "\n".join(lines)
