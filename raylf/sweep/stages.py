"""The Tune experiments a sweep runs, and a two-stage sweep's order of them.

A grid sweep is one :class:`GridStage`. A sweep with searched methods runs one
:class:`raylf.sweep.search.SearchStage` per searched method (validation only), chooses each one's
``top_k`` points, then one :class:`GridStage` of the replicates: every chosen point on every
``seeds`` seed, and the grid of the methods without a search, all reported on test data. A
stage whose Tune experiment exists is resumed; a search whose chosen points are written is not
run again, so a resumed sweep replicates the same points.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from typing import Any

from ray import tune
from ray.tune.search.basic_variant import BasicVariantGenerator

from raylf.config import validate
from raylf.labels import point_label
from raylf.sweep.placement import trial_bundles
from raylf.sweep.search import (
    Choice,
    SearchStage,
    choose,
    read_choices,
    startup_samples,
    write_choices,
)
from raylf.sweep.spec import SearchedMethod, SweepSpec, Trial

# The most trials one Tune experiment holds: a larger grid stage runs as several experiments,
# one after the other (GridStage.experiments). Tune keeps every trial of an experiment in its
# driver (about 70 KB each) and rewrites all their states, about 10 KB each, at every snapshot
# of the experiment; bounded, so is each trial's share of that. Each boundary waits for the
# last trials of a part before the next starts: with up to ~50 trials at once, a part of 2,000
# loses at most a few percent of the slots' time there.
TRIALS_PER_EXPERIMENT = 2000


class GridStage:
    """Trials known before Tune starts: a grid sweep, or a two-stage sweep's replicates. Each
    Tune config names its trial and shows its method, grid point and seed by dotted names.

    With ``per_tune_trial`` above 1, one Tune trial runs up to that many of them in turn
    (``groups``): Tune's own work per trial (scheduling it, the actor's reset, its callbacks,
    the wait for the driver between two trials) is then paid once per group, which matters
    where that work is a large share of a trial (trials of a fraction of a second; the sweep
    field ``trials_per_tune_trial`` says where it was measured). Each trial still writes its
    own tables, counts its own attempts and prints its own line."""

    def __init__(self, trials: list[Trial], sweep: str, storage: str, per_tune_trial: int = 1):
        self.objective: str | None = None  # reported on test data, chosen by nothing
        self.scheduled = False
        self.extra: dict[str, Any] = {}  # trials-row columns beyond the experiment's
        self.specs = {t.trial_id: (t.spec.to_dict(), t.point) for t in trials}
        self.per_tune_trial = per_tune_trial
        # the bundles each trial asks for: a Tune trial holds one placement group for its group
        self.shapes = {t.trial_id: json.dumps(trial_bundles(t.spec), sort_keys=True)
                       for t in trials} if per_tune_trial > 1 else {}
        self.width = max((len(t.label) for t in trials), default=0)
        self.sweep = sweep
        self.storage_path, self.name = storage.rstrip("/"), sweep
        self.root = self.path = f"{self.storage_path}/{sweep}"
        self.planned = len(trials)
        self.rounds = sum(t.spec.federation.rounds for t in trials)
        self.groups = self._grouped(sorted(self.specs))

    def _grouped(self, ids: list[str]) -> dict[str, list[str]]:
        """Tune trial name → the trials it runs, in trial-id order: consecutive trials of the
        same bundles, at most ``per_tune_trial`` of them; a group of one is named by its trial.
        Fixed by the trials alone, so a resumed sweep finds the same Tune trials."""
        chunks: list[list[str]] = []
        for trial_id in ids:
            last = chunks[-1] if chunks else None
            if (last is not None and len(last) < self.per_tune_trial
                    and self.shapes[last[0]] == self.shapes[trial_id]):
                last.append(trial_id)
            else:
                chunks.append([trial_id])
        return {chunk[0] if len(chunk) == 1 else f"{chunk[0]}-and-{len(chunk) - 1}": chunk
                for chunk in chunks}

    def experiments(self) -> list[GridStage]:
        """The Tune experiments the stage runs as: itself, or above ``TRIALS_PER_EXPERIMENT``
        trials equal parts of them by trial id, ``<root>/part-<i>`` (fixed by the trials alone,
        so a resumed sweep finds the same parts)."""
        ids = sorted(self.specs)
        count = math.ceil(len(ids) / TRIALS_PER_EXPERIMENT)
        if count <= 1:
            return [self]
        size = math.ceil(len(ids) / count)
        return [self._part(ids[i * size:(i + 1) * size], f"part-{i + 1:0{len(str(count))}d}")
                for i in range(count)]

    def _part(self, ids: list[str], name: str) -> GridStage:
        part = copy.copy(self)
        part.specs = {trial_id: self.specs[trial_id] for trial_id in ids}
        part.groups = part._grouped(ids)
        part.planned = len(ids)
        part.rounds = sum(spec["federation"]["rounds"] for spec, _ in part.specs.values())
        part.storage_path, part.name, part.path = self.root, name, f"{self.root}/{name}"
        return part

    @property
    def tune_trials(self) -> int:
        return len(self.groups)

    def trial(self, trial_id: str) -> Trial:
        spec, point = self.specs[trial_id]
        return Trial(trial_id, validate(spec), point)

    def members(self, config: dict[str, Any]) -> list[Trial]:
        """The trials a Tune config runs, in order: its own, or its group's."""
        return [self.trial(trial_id) for trial_id in self.groups[config["trial_id"]]]

    def trial_id(self, config: dict[str, Any]) -> str:
        """Tune's name of the trial: the trial id, or its group's name."""
        return config["trial_id"]

    def owns(self, row: dict[str, Any]) -> bool:
        return row["trial_id"] in self.specs

    def tune_configs(self) -> list[dict[str, Any]]:
        """Each Tune trial's config: the trial's id, method, seed and grid point by dotted names
        (``None`` where a method has no such field); a group's name, its method(s) and how many
        trials it runs. A mapping value (a grid over ``scenario``, say) is shown as its JSON:
        Tune would merge a mapping into the space's domain and fail."""
        points = []
        for name, ids in self.groups.items():
            if len(ids) > 1:
                methods = sorted({self.specs[i][0]["method"]["name"] for i in ids})
                points.append({"trial_id": name, "method": ",".join(methods),
                               "trials": len(ids)})
                continue
            spec, point = self.specs[name]
            points.append({"trial_id": name, "method": spec["method"]["name"],
                           "seed": spec["seed"],
                           **{k: json.dumps(v, sort_keys=True) if isinstance(v, dict) else v
                              for k, v in point.items()}})
        names = sorted({k for p in points for k in p}, key=lambda k: (k != "method", k))
        return [{k: p.get(k) for k in names} for p in points]

    def tune_setup(self, max_concurrent: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """The configs as Tune's ``points_to_evaluate``, one sample each; the choice domains
        only declare the fields, they are never sampled."""
        configs = self.tune_configs()
        space = {k: tune.choice(list({json.dumps(c[k]): c[k] for c in configs}.values()))
                 for k in configs[0]}
        searcher = BasicVariantGenerator(points_to_evaluate=configs,
                                         max_concurrent=max_concurrent)
        return space, {"search_alg": searcher, "num_samples": len(configs)}


def describe_search(sweep: SweepSpec, searches: list[SearchedMethod],
                    trials: list[Trial]) -> list[str]:
    """The two stages: each search and its budget, then what is replicated."""
    seeds = sweep.search_seeds
    lines = [f"sweep {sweep.name}: search {len(searches)} method(s) on validation data (search "
             f"seeds {seeds}), then the top {sweep.top_k} point(s) of each over seeds "
             f"{sweep.seeds}, reported on test data"]
    for searched in searches:
        search = searched.search
        points = searched.points
        how = {"random": "random search", "grid": "every grid point",
               "optuna": f"Optuna TPE ({startup_samples(points)} random points first)"}
        asha = (f", ASHA from round {search.scheduler.grace_rounds} (η "
                f"{search.scheduler.reduction_factor:g})" if search.scheduler else "")
        lines.append(f"  search {searched.key}: {how[search.algorithm]}, {points} points × "
                     f"{len(seeds)} seed(s) = {points * len(seeds)} trials over "
                     f"{', '.join(search.space or searched.axes)}; {search.mode} {search.objective}"
                     f"{asha}")
    replicates = len(searches) * sweep.top_k * len(sweep.seeds)
    lines.append(f"  then {replicates} replicate trials" +
                 (f" and {len(trials)} trials of the methods without a search" if trials else ""))
    return lines


def search_then_replicate(sweep: SweepSpec, searches: list[SearchedMethod],
                          grid_trials: list[Trial], storage: str,
                          run: Callable[..., list]
                          ) -> tuple[list[Trial], dict[str, Choice], bool]:
    """Stage 1 (each search not yet chosen), then stage 2; ``run(stage)`` runs one stage's Tune
    experiment. Returns the replicate trials, the choice each stands for, and whether any trial
    of either stage failed."""
    root = f"{storage.rstrip('/')}/{sweep.name}"
    failed = False
    replicates = {t.trial_id: t for t in grid_trials}
    chosen: dict[str, Choice] = {}
    for searched in searches:
        stage = SearchStage(searched, sweep.name, root)
        choices = read_choices(stage)
        if choices is None:
            grid = run(stage)
            failed |= any(result.error is not None for result in grid)
            ran = [trial for result in grid for trial in stage.members(result.config)]
            choices = choose(stage, ran, sweep.top_k)
            write_choices(stage, choices)
        print(describe_choices(searched, choices), flush=True)
        for choice in choices:
            for seed in sweep.seeds:
                trial = searched.trial(choice.point, seed)
                replicates.setdefault(trial.trial_id, trial)
                chosen[trial.trial_id] = choice
    trials = list(replicates.values())
    if trials:
        failed |= any(result.error is not None for result in run(
            GridStage(trials, sweep.name, storage, sweep.trials_per_tune_trial)))
    return trials, chosen, failed


def describe_choices(searched: SearchedMethod, choices: list[Choice]) -> str:
    if not choices:
        return (f"search {searched.key}: no point ended ok on every search seed; nothing of "
                f"{searched.entry.name} is replicated (see {searched.key}'s trials in "
                "search/tables/)")
    first = choices[0]
    stopped = f", {first.stopped} stopped by ASHA ({first.rounds_saved} rounds saved)" \
        if searched.search.scheduler else ""
    picks = "; ".join(f"#{c.rank} {point_label(c.point)} ({c.objective} {c.score:.4f})"
                      for c in choices)
    return (f"search {searched.key}: {first.budget} trials ({first.points} points){stopped}; "
            f"chose {picks}")
