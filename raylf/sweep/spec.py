"""Sweep specs: a base experiment, grid axes (shared and per method), seeds → validated trials.

Every expanded trial is validated exactly like a single experiment before anything starts, and
problems name the sweep field they came from; ``raylf.preflight.check_runnable`` then builds
each trial's data once, so a missing dataset or an impossible partition is a spec error, not a
failed trial.
A method with a ``search`` block is not expanded: it becomes a :class:`SearchedMethod` (stage 1 of
a two-stage sweep, see ``raylf.sweep.search``) whose bounds are validated the same way.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from raylf.config import ResolvedSpec, registered_methods, validate
from raylf.errors import SpecError
from raylf.experiment import default_trial_id
from raylf.labels import point_label
from raylf.schema import Strict, errors_of, load_raw, read_yaml, safe_name, set_dotted, set_path

SWEEP_FIELDS = ("name", "base", "experiment", "overrides", "grid", "methods", "seeds",
                "search_seeds", "top_k", "resources", "max_concurrent", "checkpoint_every",
                "checkpoint_min_s", "report_min_s", "max_failures", "keep_final_states")
DISTRIBUTIONS = ("uniform", "loguniform", "choice", "randint", "quniform")


def _check_axes(axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Every grid axis has values, each listed once (a repeat would run a trial twice)."""
    for axis, values in axes.items():
        if not values:
            raise ValueError(f"grid axis {axis!r} has no values; give at least one or remove "
                             "the axis")
        seen = [json.dumps(v, sort_keys=True) for v in values]
        repeated = sorted({v for v in seen if seen.count(v) > 1})
        if repeated:
            raise ValueError(f"grid axis {axis!r} lists {', '.join(repeated)} more than once; "
                             "list each value once")
    return axes


class Distribution(Strict):
    """One searched field, written ``{kind: [arguments]}``: ``uniform: [low, high]``,
    ``loguniform: [low, high]``, ``quniform: [low, high, q]``, ``randint: [low, high]`` (high
    excluded, as in Tune) or ``choice: [value, …]``."""

    kind: Literal["uniform", "loguniform", "choice", "randint", "quniform"]
    args: list[Any]

    @model_validator(mode="before")
    @classmethod
    def _from_mapping(cls, value):
        if isinstance(value, Distribution) or isinstance(value, dict) and "kind" in value:
            return value
        if isinstance(value, dict) and len(value) == 1:
            (kind, args), = value.items()
            return {"kind": kind, "args": args}
        raise ValueError(f"write a distribution as one of {{{', '.join(DISTRIBUTIONS)}}}: "
                         "[arguments], e.g. {loguniform: [1.0e-4, 1.0]}")

    @model_validator(mode="after")
    def _arguments(self):
        args, kind = self.args, self.kind
        if kind == "choice":
            if not args:
                raise ValueError("choice needs at least one value")
            return self
        arity = 3 if kind == "quniform" else 2
        if len(args) != arity or not all(isinstance(a, (int, float)) and not isinstance(a, bool)
                                         for a in args):
            names = "[low, high, q]" if kind == "quniform" else "[low, high]"
            raise ValueError(f"{kind} takes {names} (numbers)")
        low, high = args[0], args[1]
        if not low < high:
            raise ValueError(f"{kind}: low {low} must be below high {high}")
        if kind == "loguniform" and low <= 0:
            raise ValueError("loguniform: low must be > 0")
        if kind == "randint" and not all(isinstance(a, int) for a in args):
            raise ValueError("randint takes integers [low, high] (high excluded)")
        if kind == "quniform" and args[2] <= 0:
            raise ValueError("quniform: q must be > 0")
        return self

    def extremes(self) -> list[Any]:
        """The values a validation must try: both ends (as sampled) or every choice."""
        if self.kind == "choice":
            return list(self.args)
        if self.kind == "randint":
            return [self.args[0], self.args[1] - 1]
        if self.kind == "quniform":
            low, high, q = self.args
            return [round(low / q) * q, round(high / q) * q]
        return list(self.args)


class SchedulerSpec(Strict):
    name: Literal["asha"] = "asha"
    grace_rounds: int = Field(ge=1, description="rounds every trial runs before it can be "
                                                "stopped")
    reduction_factor: float = Field(4.0, gt=1, description="ASHA's η: 1/η of the trials "
                                                           "go on at each rung")


class SearchSpec(Strict):
    algorithm: Literal["random", "optuna", "grid"] = Field(
        description="random (Tune's random search), optuna (Tune's OptunaSearch with TPE) or "
                    "grid (every point of the method's grid)")
    samples: int | None = Field(None, ge=1, description="points sampled (random, optuna)")
    space: dict[str, Distribution] = Field(default_factory=dict, description="dotted field → "
                                                                             "distribution")
    objective: str = Field("val_acc_mean", description="a validation metric of the rounds "
                                                       "table (val_…), at the last round")
    mode: Literal["max", "min"] = "max"
    scheduler: SchedulerSpec | None = None

    @field_validator("objective")
    @classmethod
    def _validation_only(cls, v: str) -> str:
        if not v.startswith("val_"):
            raise ValueError(
                f"{v!r} is not a validation metric: a search chooses on validation data only, "
                "never test data; use val_acc_mean (or another val_… rounds-table metric such "
                "as val_acc_bottom20) and set scenario.val_fraction > 0")
        return v

    @model_validator(mode="after")
    def _budget(self):
        if self.algorithm == "grid":
            if self.samples is not None or self.space:
                raise ValueError("algorithm grid evaluates every point of the method's grid: "
                                 "remove samples and space")
        else:
            if self.samples is None:
                raise ValueError(f"algorithm {self.algorithm} needs samples (the budget: "
                                 "points to evaluate)")
            if not self.space:
                raise ValueError(f"algorithm {self.algorithm} needs a space, e.g. "
                                 "{method.params.mu: {loguniform: [1.0e-4, 1.0]}}")
        if "seed" in self.space:
            raise ValueError("seed cannot be searched: list the seeds in search_seeds")
        return self


class MethodEntry(Strict):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    overrides: dict[str, Any] = Field(default_factory=dict,
                                      description="dotted fixed values for this method only")
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    search: SearchSpec | None = None

    _axes = field_validator("grid")(_check_axes)

    @model_validator(mode="after")
    def _grid_or_space(self):
        if self.search is not None and self.search.algorithm != "grid" and self.grid:
            raise ValueError(f"give either grid (with search.algorithm: grid) or search.space "
                             f"(algorithm {self.search.algorithm}), not both")
        return self


class SweepSpec(Strict):
    name: str
    base: str | None = Field(None, description="path of the base experiment spec")
    experiment: dict[str, Any] | None = Field(None, description="inline base experiment")
    overrides: dict[str, Any] = Field(default_factory=dict, description="dotted fixed values")
    grid: dict[str, list[Any]] = Field(default_factory=dict, description="axes for every method")
    methods: list[MethodEntry] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    search_seeds: list[int] = Field(default_factory=lambda: [0], min_length=1,
                                    description="seeds each searched point is evaluated on")
    top_k: int = Field(1, ge=1, description="points per searched method replicated over seeds")
    resources: dict[str, Any] | None = Field(None, description="per-trial resources")
    max_concurrent: int | None = Field(None, ge=1)
    checkpoint_every: int = Field(
        5, ge=1, description="rounds between trial checkpoints (none after the last round, whose "
                             "tables follow at once, unless keep_final_states lists the method)")
    checkpoint_min_s: float = Field(
        10.0, ge=0, description="least seconds between two checkpoints of a trial: fast rounds "
                                "would otherwise make Tune snapshot the whole experiment every "
                                "few rounds")
    # Evidence for 1 s (benchmarks/cheap_trials.py, 48 trials of a digits MLP on 2 cores,
    # benchmarks README "Cheap trials"): with every round reported, a warm 100-round trial spent
    # about 4.7 ms a round waiting in tune.report for the driver (the round itself: 6-7 ms), and
    # the sweep's trial phase was 2.84x (2.55x on a quieter run) its compute bound; with 1 s it
    # was 2.28x (2.18x). Rounds of a second or more (the paper-scale specs) are all reported
    # anyway, so the default only thins out tiny rounds.
    report_min_s: float = Field(
        1.0, ge=0, description="least seconds between two of a trial's Tune reports, except "
                               "that a round that carries the objective, is checkpointed, "
                               "diverges or ends the trial is always reported, and so is one "
                               "that evaluates under --log or --verbose (the tables record "
                               "every round either way); 0 reports every round to Tune")
    max_failures: int = Field(2, ge=0, description="retries of a failed trial (from checkpoint)")
    # Default 1, from benchmarks/sweep_scaling.py (benchmarks README, "Sweep scaling"; 2 cores,
    # 3-round digits trials of about 25 ms): groups of 8 took a trial's share of the sweep from
    # about 33-40 ms to 23-26 ms. Trials of seconds gain nothing measurable, and grouping costs
    # them Tune's per-trial dashboard rows, trackers and checkpoint restore, so it is opt-in.
    trials_per_tune_trial: int = Field(
        1, ge=1, description="trials one Tune trial runs in turn (grid and replicate trials of "
                             "the same resources; a search's trials always one each): Tune's "
                             "own work per trial, tens of milliseconds, is then paid once per "
                             "group, which pays for trials of a fraction of a second. Each trial "
                             "still has its own tables, attempts, checkpoints and console line; "
                             "a trial that fails has its group retried (max_failures), the "
                             "trials that ended kept")
    keep_final_states: list[str] = Field(
        default_factory=list, description="methods whose trials keep their final personal "
        "states (checkpoints/<trial>/round-<last>/, what python -m raylf.diagnostics donor-swap "
        "reads); every other trial that ended for good leaves no checkpoint behind")

    _axes = field_validator("grid")(_check_axes)
    _name = field_validator("name")(safe_name)

    @field_validator("keep_final_states")
    @classmethod
    def _known_methods(cls, names: list[str]) -> list[str]:
        methods = registered_methods()
        unknown = [name for name in names if name not in methods]
        if unknown:
            raise ValueError(f"unknown method {', '.join(map(repr, unknown))}; allowed: "
                             f"{', '.join(methods.names())}")
        return names

    @model_validator(mode="after")
    def _one_base(self):
        if (self.base is None) == (self.experiment is None):
            raise ValueError("give exactly one of base (a spec file) or experiment (inline)")
        if self.grid and any(m.search is not None and m.search.algorithm != "grid"
                             for m in self.methods):
            raise ValueError("a sweep-level grid cannot be combined with a sampled search: move "
                             "its axes into each method's grid or search.space")
        for field in ("search_seeds", "seeds"):
            values = getattr(self, field)
            if len(set(values)) != len(values):
                raise ValueError(f"{field} lists a seed more than once; list each seed once")
        return self

    @property
    def searched(self) -> bool:
        return any(m.search is not None for m in self.methods)


@dataclass(frozen=True)
class Trial:
    trial_id: str
    spec: ResolvedSpec
    point: dict[str, Any]  # the grid values that define this trial (without the seed)

    @property
    def label(self) -> str:
        values = point_label(self.point)
        method = f"{self.spec.method.name}({values})" if values else self.spec.method.name
        return f"{method} seed={self.spec.seed}"


@dataclass(frozen=True)
class SearchedMethod:
    """A searched method: stage 1 evaluates its points on ``seeds``; :meth:`trial` turns one
    sampled point into a validated trial (what every Tune trial of the stage runs)."""

    key: str  # names the stage: its Tune experiment and its rows in the selection table
    index: int
    entry: MethodEntry
    base: dict[str, Any]
    axes: dict[str, list[Any]]  # algorithm grid: the grid it evaluates
    seeds: tuple[int, ...]
    rounds: int  # the most rounds a trial of the stage runs (ASHA's horizon)

    @property
    def search(self) -> SearchSpec:
        assert self.entry.search is not None
        return self.entry.search

    @property
    def points(self) -> int:
        """Points stage 1 evaluates (each on every search seed)."""
        return self.search.samples or len(_grid_points(self.axes))

    def trial(self, point: dict[str, Any], seed: int) -> Trial:
        return build_trial(self.base, self.entry, point, seed)

    def identity(self) -> str:
        """What a resumed sweep must not change about this search."""
        blob = {"base": self.base, "entry": self.entry.model_dump(mode="json"),
                "axes": self.axes, "seeds": self.seeds}
        return json.dumps(blob, sort_keys=True)


def load_sweep(path: str | Path, overrides: list[str] = ()) -> tuple[SweepSpec, list[Trial]]:
    """Read, override and validate a sweep file; expand it into validated trials (those of the
    methods without a ``search``; :func:`searched_methods` gives the others)."""
    raw = load_raw(path)
    if not isinstance(raw, dict):
        raise SpecError([("", "a sweep spec must be a mapping of fields")], str(path))
    raw = _as_sweep(raw, Path(path))
    for assignment in overrides:
        key = assignment.split("=", 1)[0].split(".", 1)[0]
        if key in SWEEP_FIELDS:
            set_dotted(raw, assignment)
        else:  # an experiment field: a fixed override of the base experiment
            dotted, _, text = assignment.partition("=")
            raw.setdefault("overrides", {})[dotted.strip()] = read_yaml(text)
    try:
        sweep = SweepSpec.model_validate(raw)
    except ValidationError as err:
        raise SpecError(errors_of(err), str(path)) from None
    return sweep, expand(sweep, Path(path).parent, str(path))


def _as_sweep(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """An experiment spec given where a sweep is expected is the sweep of that one experiment
    (its own seed), so every spec file under tune/ can be planned, smoke-run and estimated."""
    if any(field in raw for field in ("base", "experiment", "methods", "seeds")) or \
            not any(field in raw for field in ("dataset", "preset", "method")):
        return raw
    experiment = {k: v for k, v in raw.items() if k != "seed"}
    return {"name": raw.get("name") or path.stem, "experiment": experiment,
            "seeds": [raw.get("seed", 0)]}


def _base(sweep: SweepSpec, folder: Path, source: str) -> dict[str, Any]:
    if sweep.experiment is not None:
        return copy.deepcopy(sweep.experiment)
    for candidate in (Path(sweep.base), folder / sweep.base, folder.parent / sweep.base):
        if candidate.is_file():
            return load_raw(candidate)
    raise SpecError([("base", f"base spec not found: {sweep.base}")], source)


def _resolved_base(sweep: SweepSpec, folder: Path, source: str | None) -> dict[str, Any]:
    base = _base(sweep, folder, source or sweep.name)
    base["name"] = sweep.name
    for dotted, value in sweep.overrides.items():
        set_path(base, dotted, copy.deepcopy(value))
    if sweep.resources is not None:
        base["resources"] = {**base.get("resources", {}), **sweep.resources}
    return base


def _entries(sweep: SweepSpec, base: dict[str, Any]) -> list[MethodEntry]:
    return sweep.methods or [MethodEntry(**base.get("method", {}))]


def build_trial(base: dict[str, Any], entry: MethodEntry, point: dict[str, Any],
                seed: int) -> Trial:
    """The base experiment with the method, its own overrides, the point and the seed."""
    raw = copy.deepcopy(base)
    raw["method"] = {"name": entry.name, "params": copy.deepcopy(entry.params)}
    raw["seed"] = seed
    for dotted, value in {**entry.overrides, **point}.items():
        set_path(raw, dotted, copy.deepcopy(value))
    spec = validate(raw)
    return Trial(default_trial_id(spec), spec, point)


def _grid_points(axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


def _where(sweep: SweepSpec, m: int, entry: MethodEntry) -> str:
    return f"methods[{m}] ({entry.name})" if sweep.methods else "base"


def expand(sweep: SweepSpec, folder: Path = Path("."), source: str | None = None) -> list[Trial]:
    base = _resolved_base(sweep, folder, source)
    trials: list[Trial] = []
    problems: list[tuple[str, str]] = []
    for m, entry in enumerate(_entries(sweep, base)):
        if entry.search is not None:
            continue
        for point in _grid_points({**sweep.grid, **entry.grid}):
            for seed in sweep.seeds:
                try:
                    trials.append(build_trial(base, entry, point, seed))
                except SpecError as err:
                    where = _where(sweep, m, entry)
                    problems += [(f"{where} {path}", msg) for path, msg in err.problems]
    if problems:
        raise SpecError(sorted(set(problems)), source)
    _refuse_twins(trials, source)
    return trials


def _refuse_twins(trials: list[Trial], source: str | None) -> None:
    ids = [t.trial_id for t in trials]
    twins = sorted({t.label for t in trials if ids.count(t.trial_id) > 1})
    if twins:
        raise SpecError([("methods", (
            f"{'; '.join(twins)} appear(s) more than once with identical configurations (the "
            "same method and grid point listed twice); remove the repeated entry"))], source)


def searched_methods(sweep: SweepSpec, folder: Path = Path("."),
                 source: str | None = None) -> tuple[list[SearchedMethod], list[Trial]]:
    """The searched methods, and the trials that stand for each one's bounds (every
    end of every distribution, every choice, every grid point, on every search seed): they are
    validated here and their data built by ``raylf.preflight.check_runnable``, so a search
    cannot fail on a value its space allows."""
    base = _resolved_base(sweep, folder, source)
    searches: list[SearchedMethod] = []
    probes: list[Trial] = []
    problems: list[tuple[str, str]] = []
    for m, entry in enumerate(_entries(sweep, base)):
        search = entry.search
        if search is None:
            continue
        where = _where(sweep, m, entry)
        axes = {**sweep.grid, **entry.grid} if search.algorithm == "grid" else {}
        if search.algorithm == "grid" and not axes:
            problems.append((f"{where} grid", "algorithm grid needs grid axes to evaluate"))
            continue
        entry_probes: list[Trial] = []
        for point in _probe_points(search, axes):
            for seed in sweep.search_seeds:
                try:
                    entry_probes.append(build_trial(base, entry, point, seed))
                except SpecError as err:
                    problems += [(f"{where} search {path}", msg) for path, msg in err.problems]
        if not entry_probes:
            continue
        problems += _search_problems(where, search, entry_probes)
        probes += entry_probes
        searches.append(SearchedMethod(
            f"{m}-{entry.name}", m, entry, base, axes, tuple(sweep.search_seeds),
            max(t.spec.federation.rounds for t in entry_probes)))
    if problems:
        raise SpecError(sorted(set(problems)), source)
    return searches, probes


def _probe_points(search: SearchSpec, axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    if axes:
        return _grid_points(axes)
    low = {k: d.extremes()[0] for k, d in search.space.items()}
    points = [low, {k: d.extremes()[-1] for k, d in search.space.items()}]
    points += [{**low, k: v} for k, d in search.space.items() if d.kind == "choice"
               for v in d.args]
    unique = {json.dumps(p, sort_keys=True): p for p in points}
    return list(unique.values())


def _search_problems(where: str, search: SearchSpec,
                     probes: list[Trial]) -> list[tuple[str, str]]:
    problems = []
    if any(getattr(t.spec.scenario_params, "val_fraction", 0) <= 0 for t in probes):
        problems.append((f"{where} scenario.val_fraction", (
            f"a search chooses on validation data ({search.objective}), and this scenario holds "
            "none out; set scenario.val_fraction (e.g. 0.2) in the base or the overrides")))
    if search.algorithm == "optuna" and importlib.util.find_spec("optuna") is None:
        problems.append((f"{where} search.algorithm", (
                "optuna is not installed; pip install 'raylf[search]' (or use algorithm: "
                "random)")))
    scheduler = search.scheduler
    fewest = min(t.spec.federation.rounds for t in probes)
    if scheduler is not None and scheduler.grace_rounds >= fewest:
        problems.append((f"{where} search.scheduler.grace_rounds", (
            f"{scheduler.grace_rounds} leaves ASHA nothing to stop in {fewest} rounds; give "
            f"fewer than {fewest}")))
    return problems
