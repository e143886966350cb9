"""Stage 1 of a two-stage sweep: a method's ``search`` on Ray Tune, and the points it chooses.

A searched method is one Tune experiment under ``<sweep>/search/<key>/``: Tune's random search
(``BasicVariantGenerator``), its ``OptunaSearch`` with a TPE sampler, or a grid, over the dotted
fields of the method's ``search.space``, each point on every ``search_seeds`` seed (Optuna
through Tune's ``Repeater``, which hands it the mean over the seeds). Every searcher is seeded
from the first search seed and the method's position (``raylf.seeding``). The trials write their
tables under ``<sweep>/search/tables/`` (never the sweep's own tables, which hold what is
reported on test data). ASHA, when asked for, decides on the per-round reports of the objective;
its stop is carried out by the trial itself (:class:`RecordedASHA`), so a stopped trial records
its rounds with status ``stopped``. Once a method's experiment is done, its ``top_k`` points by
the mean objective over the search seeds (only points whose every seed ended ``ok``) are written
to ``<sweep>/search/tables/selection/<key>.parquet`` and read back on resume, so a resumed sweep
replicates the same points.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search import Repeater
from ray.tune.search.basic_variant import BasicVariantGenerator
from ray.tune.search.repeater import TRIAL_INDEX

from raylf import results, seeding
from raylf.storage import create_folder
from raylf.sweep.spec import Distribution, SearchedMethod, Trial

SELECTION = "selection"  # the table of chosen points, next to the search trials' tables


def objective_value(record: dict[str, Any], objective: str) -> float | None:
    """The objective in a rounds record or trials row: its own column, or for a multi-task
    method (columns ``<objective>_<task>``) the mean over the tasks of the reported model
    (columns that extend another one, such as ``…_binary_own_heads``, are other deployables)."""
    if objective in record:
        value = record[objective]
        return None if value is None else float(value)
    found = [k for k in record if k.startswith(objective + "_") and record[k] is not None]
    tasks = [k for k in found if not any(k != o and k.startswith(o + "_") for o in found)]
    return statistics.fmean(float(record[k]) for k in tasks) if tasks else None


def _to_tune(dist: Distribution):
    make = {"uniform": tune.uniform, "loguniform": tune.loguniform, "randint": tune.randint,
            "quniform": tune.quniform}
    return tune.choice(dist.args) if dist.kind == "choice" else make[dist.kind](*dist.args)


def search_seed(searched: SearchedMethod) -> int:
    return seeding.derive(searched.seeds[0], "search", searched.index) % 2**32


def startup_samples(samples: int) -> int:
    """Random points Optuna's TPE draws before it models: a third of the budget, 2 to 10."""
    return min(10, max(2, samples // 3))


# ---- stop decisions carried out by the trial ----------------------------------------------------

def _stop_path(experiment: str, tune_trial_id: str) -> tuple[pafs.FileSystem, str]:
    fs, base = results.filesystem(experiment)
    return fs, f"{base}/stops/{tune_trial_id}.json"


def mark_stop(experiment: str, tune_trial_id: str, rnd: int, value: float | None) -> None:
    fs, path = _stop_path(experiment, tune_trial_id)
    create_folder(fs, path.rsplit("/", 1)[0])
    with fs.open_output_stream(path) as f:
        f.write(json.dumps({"round": rnd, "value": value}).encode())


def stop_mark(experiment: str, tune_trial_id: str) -> dict[str, Any] | None:
    """ASHA's decision about this trial (``round``, ``value``), or None if it goes on."""
    fs, path = _stop_path(experiment, tune_trial_id)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        return json.loads(f.read())


class RecordedASHA(ASHAScheduler):
    """Tune's ASHA whose stop reaches the trial as a mark it reads after its report returns.

    Tune stops a function trial by ending its process at the next report, before it could
    write its tables; here the trial ends itself with status ``stopped`` and its rounds kept.
    """

    def __init__(self, experiment: str, **asha):
        super().__init__(stop_last_trials=False, **asha)
        self.experiment = experiment

    def on_trial_result(self, tune_controller, trial, result):
        if super().on_trial_result(tune_controller, trial, result) == self.STOP:
            mark_stop(self.experiment, trial.trial_id, int(result["round"]),
                      result.get(self.metric))
        return self.CONTINUE


# ---- the stage --------------------------------------------------------------------------------

class SearchStage:
    """One searched method as a Tune experiment: its space, searcher and scheduler, and the
    trial each Tune config stands for."""

    def __init__(self, searched: SearchedMethod, sweep: str, root: str):
        self.searched, self.sweep = searched, sweep
        self.root = f"{root}/search"  # tables, attempts and checkpoints of the search trials
        self.storage_path, self.name = self.root, searched.key
        self.path = f"{self.root}/{searched.key}"
        self.objective = searched.search.objective
        self.scheduled = searched.search.scheduler is not None
        self.extra = {"search": searched.key}
        self.width = 0  # labels are known once the searcher proposes them
        self.planned = searched.points * len(searched.seeds)
        self.rounds = self.planned * searched.rounds

    def trial(self, config: dict[str, Any]) -> Trial:
        seed = config["seed"] if "seed" in config else self.searched.seeds[config[TRIAL_INDEX]]
        point = {k: v for k, v in config.items() if k not in ("method", "seed", TRIAL_INDEX)}
        return self.searched.trial(point, seed)

    @property
    def tune_trials(self) -> int:
        return self.planned

    def members(self, config: dict[str, Any]) -> list[Trial]:
        """A search trial is one Tune trial (its scheduler and searcher see each)."""
        return [self.trial(config)]

    def trial_id(self, config: dict[str, Any]) -> str:
        return self.trial(config).trial_id

    def experiments(self) -> list[SearchStage]:
        """One Tune experiment, however many trials: its searcher and scheduler see them all."""
        return [self]

    def owns(self, row: dict[str, Any]) -> bool:
        """Whether a row of the search tables is one of this stage's trials."""
        return row.get("search") == self.searched.key

    def tune_setup(self, max_concurrent: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """Tune's param_space and the TuneConfig fields that define the search."""
        search, seeds = self.searched.search, list(self.searched.seeds)
        scheduler: dict[str, Any] = {}
        if search.scheduler is not None:
            scheduler["scheduler"] = RecordedASHA(
                self.path, time_attr="round", metric=search.objective, mode=search.mode,
                max_t=self.searched.rounds, grace_period=search.scheduler.grace_rounds,
                reduction_factor=search.scheduler.reduction_factor)
        method = {"method": self.searched.entry.name}  # shown in Tune's config, not searched
        if search.algorithm == "grid":
            space = {k: tune.grid_search(v) for k, v in self.searched.axes.items()}
            return {**method, **space, "seed": tune.grid_search(seeds)}, {
                "num_samples": 1, "max_concurrent_trials": max_concurrent, **scheduler}
        space = {**method, **{k: _to_tune(d) for k, d in search.space.items()}}
        if search.algorithm == "random":
            searcher = BasicVariantGenerator(constant_grid_search=True,
                                             random_state=search_seed(self.searched),
                                             max_concurrent=max_concurrent)
            return {**space, "seed": tune.grid_search(seeds)}, {
                "search_alg": searcher, "num_samples": search.samples, **scheduler}
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(seed=search_seed(self.searched),
                                             n_startup_trials=startup_samples(search.samples))
        searcher = Repeater(OptunaSearch(metric=search.objective, mode=search.mode,
                                         sampler=sampler), repeat=len(seeds))
        return space, {"search_alg": searcher, "num_samples": search.samples * len(seeds),
                       "max_concurrent_trials": max_concurrent, **scheduler}


# ---- choosing -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Choice:
    """A point chosen on validation data, and what its search spent."""

    search: str
    method: str
    rank: int
    point: dict[str, Any]
    score: float
    objective: str
    mode: str
    trials: list[str]  # the search trials the score is the mean of
    points: int  # points the search evaluated
    budget: int  # search trials it ran
    stopped: int  # of them stopped by ASHA
    rounds_saved: int  # rounds the stopped trials did not run


def _last_round(root: str, trial_id: str) -> int:
    fs, base = results.filesystem(root)
    table = pq.read_table(f"{base}/tables/rounds/{trial_id}.parquet", columns=["round"],
                          filesystem=fs)
    return max(table.column("round").to_pylist(), default=0)


def choose(stage: SearchStage, trials: list[Trial], top_k: int) -> list[Choice]:
    """The ``top_k`` points of the stage's ``trials`` by mean objective over the search seeds;
    a point counts only if every one of its seeds ended ``ok`` (never a stopped trial)."""
    searched, search = stage.searched, stage.searched.search
    rows = {t.trial_id: results.read_trial(stage.root, t.trial_id) or {"status": "failed"}
            for t in trials}
    by_point: dict[str, list[Trial]] = {}
    for t in trials:
        by_point.setdefault(json.dumps(t.point, sort_keys=True), []).append(t)
    stopped = [t for t in trials if rows[t.trial_id]["status"] == "stopped"]
    saved = sum(t.spec.federation.rounds - _last_round(stage.root, t.trial_id) for t in stopped)
    scored = []
    for key, group in by_point.items():
        values = [objective_value(rows[t.trial_id], search.objective) for t in group]
        if len(group) == len(searched.seeds) and None not in values and \
                all(rows[t.trial_id]["status"] == "ok" for t in group):
            scored.append((statistics.fmean(values), key, group))
    sign = -1 if search.mode == "max" else 1
    scored.sort(key=lambda s: (sign * s[0], s[1]))
    return [Choice(searched.key, searched.entry.name, rank, group[0].point, score, search.objective,
                   search.mode, sorted(t.trial_id for t in group), len(by_point), len(trials),
                   len(stopped), saved)
            for rank, (score, _, group) in enumerate(scored[:top_k], 1)]


def write_choices(stage: SearchStage, choices: list[Choice]) -> None:
    rows = [{**asdict(c), "point": json.dumps(c.point, sort_keys=True),
             "trials": json.dumps(c.trials)} for c in choices]
    meta = results.provenance({"search": stage.searched.identity()})
    results.write_table(stage.root, SELECTION, stage.searched.key, results.to_table(rows, meta))


def read_choices(stage: SearchStage) -> list[Choice] | None:
    """The stage's chosen points if its search has finished (an empty list: none qualified)."""
    fs, base = results.filesystem(stage.root)
    path = f"{base}/tables/{SELECTION}/{stage.searched.key}.parquet"
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    rows = pq.read_table(path, filesystem=fs).to_pylist()
    return [Choice(**{**r, "point": json.loads(r["point"]), "trials": json.loads(r["trials"])})
            for r in rows if r.get("search") is not None]
