"""Sweep specs: a base experiment, grid axes (shared and per method), seeds → validated trials.

Every expanded trial is validated exactly like a single experiment before anything starts, and
problems name the sweep field they came from; :func:`check_runnable` then builds each trial's
data once, so a missing dataset or an impossible partition is a spec error, not a failed trial.
"""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from raylf.config import ExperimentSpec, SpecError, Strict, _errors, load_raw, set_dotted, validate
from raylf.experiment import default_trial_id

SWEEP_FIELDS = ("name", "base", "experiment", "overrides", "grid", "methods", "seeds",
                "resources", "max_concurrent", "checkpoint_every", "checkpoint_min_s",
                "max_failures")


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


class MethodEntry(Strict):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)

    _axes = field_validator("grid")(_check_axes)


class SweepSpec(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    base: str | None = Field(None, description="path of the base experiment spec")
    experiment: dict[str, Any] | None = Field(None, description="inline base experiment")
    overrides: dict[str, Any] = Field(default_factory=dict, description="dotted fixed values")
    grid: dict[str, list[Any]] = Field(default_factory=dict, description="axes for every method")
    methods: list[MethodEntry] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    resources: dict[str, Any] | None = Field(None, description="per-trial resources")
    max_concurrent: int | None = Field(None, ge=1)
    checkpoint_every: int = Field(5, ge=1, description="rounds between trial checkpoints")
    checkpoint_min_s: float = Field(
        10.0, ge=0, description="least seconds between two checkpoints of a trial (the last "
                                "round is always checkpointed): fast rounds would otherwise make "
                                "Tune snapshot the whole experiment every few rounds")
    max_failures: int = Field(2, ge=0, description="retries of a failed trial (from checkpoint)")

    _axes = field_validator("grid")(_check_axes)

    @model_validator(mode="after")
    def _one_base(self):
        if (self.base is None) == (self.experiment is None):
            raise ValueError("give exactly one of base (a spec file) or experiment (inline)")
        return self


@dataclass(frozen=True)
class Trial:
    trial_id: str
    spec: ExperimentSpec
    point: dict[str, Any]  # the grid values that define this trial (without the seed)

    @property
    def label(self) -> str:
        values = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in self.point.items())
        method = f"{self.spec.method.name}({values})" if values else self.spec.method.name
        return f"{method} seed={self.spec.seed}"


def load_sweep(path: str | Path, overrides: list[str] = ()) -> tuple[SweepSpec, list[Trial]]:
    """Read, override and validate a sweep file; expand it into validated trials."""
    raw = load_raw(path)
    if not isinstance(raw, dict):
        raise SpecError([("", "a sweep spec must be a mapping of fields")], str(path))
    for assignment in overrides:
        key = assignment.split("=", 1)[0].split(".", 1)[0]
        if key in SWEEP_FIELDS:
            set_dotted(raw, assignment)
        else:  # an experiment field: a fixed override of the base experiment
            dotted, _, text = assignment.partition("=")
            raw.setdefault("overrides", {})[dotted.strip()] = yaml.safe_load(text)
    try:
        sweep = SweepSpec.model_validate(raw)
    except ValidationError as err:
        raise SpecError(_errors(err), str(path)) from None
    return sweep, expand(sweep, Path(path).parent, str(path))


def _base(sweep: SweepSpec, folder: Path, source: str) -> dict[str, Any]:
    if sweep.experiment is not None:
        return copy.deepcopy(sweep.experiment)
    for candidate in (Path(sweep.base), folder / sweep.base, folder.parent / sweep.base):
        if candidate.is_file():
            return load_raw(candidate)
    raise SpecError([("base", f"base spec not found: {sweep.base}")], source)


def _assign(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise SpecError([(dotted, f"{part!r} is not a mapping")])
    node[leaf] = copy.deepcopy(value)


def expand(sweep: SweepSpec, folder: Path = Path("."), source: str | None = None) -> list[Trial]:
    base = _base(sweep, folder, source or sweep.name)
    base["name"] = sweep.name
    for dotted, value in sweep.overrides.items():
        _assign(base, dotted, value)
    if sweep.resources is not None:
        base["resources"] = {**base.get("resources", {}), **sweep.resources}
    entries = sweep.methods or [MethodEntry(**base.get("method", {}))]
    trials: list[Trial] = []
    problems: list[tuple[str, str]] = []
    for m, entry in enumerate(entries):
        axes = {**sweep.grid, **entry.grid}
        for values in itertools.product(*axes.values()):
            point = dict(zip(axes, values))
            for seed in sweep.seeds:
                raw = copy.deepcopy(base)
                raw["method"] = {"name": entry.name, "params": copy.deepcopy(entry.params)}
                raw["seed"] = seed
                for dotted, value in point.items():
                    _assign(raw, dotted, value)
                try:
                    spec = validate(raw)
                except SpecError as err:
                    where = f"methods[{m}] ({entry.name})" if sweep.methods else "base"
                    problems += [(f"{where} {path}", msg) for path, msg in err.problems]
                    continue
                trials.append(Trial(default_trial_id(spec), spec, point))
    if problems:
        raise SpecError(sorted(set(problems)), source)
    ids = [t.trial_id for t in trials]
    twins = sorted({t.label for t in trials if ids.count(t.trial_id) > 1})
    if twins:
        raise SpecError([("methods", (
            f"{'; '.join(twins)} appear(s) more than once with identical configurations (the "
            "same method and grid point listed twice); remove the repeated entry"))], source)
    return trials


def check_runnable(specs: list[ExperimentSpec]) -> None:
    """Build every spec's data and method once, before anything starts: a dataset that is not
    fetched, an unreadable file or a partition that leaves a client without data is reported
    like any other spec error (each dataset is loaded once, however many trials share it)."""
    from raylf.data import build_federation
    from raylf.data.manifest import DatasetError
    from raylf.data.sources import load_source
    from raylf.runtime.blueprint import Blueprint

    sources: dict[str, Any] = {}
    methods_checked: set[str] = set()
    problems: list[tuple[str, str]] = []
    for spec in specs:
        key = json.dumps([spec.dataset.name, spec.dataset.params.model_dump(mode="json")])
        if key not in sources:
            try:
                sources[key] = load_source(spec.dataset.name, spec.dataset.params)
            except (DatasetError, ValueError, OSError) as err:
                sources[key] = None
                problems.append(_dataset_problem(spec, err))
        if sources[key] is None:
            continue
        try:
            federation = build_federation(spec, sources[key])
        except SpecError as err:
            problems += err.problems
            continue
        except ValueError as err:
            problems.append(("scenario", (
                f"{spec.scenario.name} with federation.num_clients={spec.federation.num_clients} "
                f"(seed {spec.seed}): {err}; change the scenario's parameters or "
                "federation.num_clients")))
            continue
        shape = json.dumps({k: v for k, v in spec.to_dict().items() if k != "seed"},
                           sort_keys=True)
        if shape not in methods_checked:
            methods_checked.add(shape)
            try:
                Blueprint(spec, federation).method()
            except SpecError as err:
                problems += err.problems
    if problems:
        raise SpecError(sorted(set(problems)))


def _dataset_problem(spec: ExperimentSpec, err: Exception) -> tuple[str, str]:
    """(field, message): a source's own errors may already start with the field they are about."""
    field, sep, rest = str(err).partition(": ")
    if sep and field == "dataset.path":
        return field, (f"{rest}; an npz needs arrays x (N samples) and y (N integer labels), "
                       "optionally y_<task>")
    if sep and field.startswith("dataset."):
        return field, rest
    text = str(err)
    return "dataset.name", text if repr(spec.dataset.name) in text else \
        f"{spec.dataset.name}: {text}"
