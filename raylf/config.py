"""Specs resolved against the registries: YAML (plus ``--set`` overrides) in, a typed experiment
or one clear error list out.

``raylf.schema`` checks a spec's structure. Here each named component (dataset, scenario,
model, method) is looked up in its registry and validates its own parameters with the
``Params`` model it registered, so a sweep axis such as ``method.params.mu`` or
``scenario.alpha`` is checked exactly like the file. The method then adds what only it sees in
the whole spec (``Method.check``: FedCE's two participants per round), and every problem found
is reported in one error. What comes out is a :class:`ResolvedSpec`: the spec as written plus
the method's class and every component's typed parameters, the form the runtime and every
command above it take.

This module sits above every registry (data sources and scenarios, models, methods) and
imports them; none of them imports it, and the schema below them all imports none of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from raylf.data import presets
from raylf.data.scenarios import SCENARIOS
from raylf.data.sources import SOURCES
from raylf.errors import SpecError
from raylf.methods import METHODS, Method, MethodParams
from raylf.models import MODELS
from raylf.plugins import load_plugins
from raylf.registry import Registry, UnknownName
from raylf.schema import ExperimentSpec, errors_of, flatten, load_raw, parse, set_dotted


class ResolvedSpec(ExperimentSpec):
    """An ``ExperimentSpec`` resolved against the registries: its fields as written, plus the
    method's class and each component's parameters validated by the ``Params`` it registered.
    Only :func:`resolve` builds one, so none is ever half-resolved. It dumps (``to_dict``,
    ``digest``) exactly as the spec it came from: the typed parts are derived, not written;
    what a trial records of it (:meth:`resolved`, ``flat``) has every default filled in."""

    method_class: type[Method] = Field(exclude=True)
    method_params: MethodParams = Field(exclude=True)
    model_params: BaseModel = Field(exclude=True)
    dataset_params: BaseModel = Field(exclude=True)
    scenario_params: BaseModel = Field(exclude=True)

    def resolved(self) -> dict[str, Any]:
        """The spec as it runs: ``to_dict`` with every dataset, scenario and model parameter
        and every method parameter filled in from its ``Params``, defaults included. This is
        what a trial records (the trials table's config columns, the Parquet metadata), so a
        default that changes in a later version never makes an old result ambiguous."""
        out = self.to_dict()
        for part in ("dataset", "scenario", "model"):
            params = getattr(self, f"{part}_params").model_dump(mode="json")
            out[part] = {"name": getattr(self, part).name, **params}
        out["method"] = {"name": self.method.name,
                         "params": self.method_params.model_dump(mode="json")}
        return out

    def flat(self) -> dict[str, Any]:
        """Every scalar leaf of :meth:`resolved` as ``dotted.key: value`` (the trials table's
        config columns)."""
        return dict(flatten(self.resolved()))


def registered_methods() -> Registry[type[Method]]:
    """The method registry, the plugins' methods in it (``RAYLF_PLUGINS``)."""
    load_plugins()
    return METHODS


def _validated(registry: Registry, name: str, values: dict[str, Any], where: str,
               problems: list[tuple[str, str]]):
    """(registered entry, its ``Params`` validated from ``values``), or None with the
    problems added under ``where``."""
    try:
        entry = registry.get(name)
    except UnknownName as err:
        problems.append((f"{where.split('.')[0]}.name", str(err)))
        return None
    try:
        return entry, entry.Params.model_validate(values)
    except ValidationError as err:
        problems.extend(errors_of(err, where))
        return None


def resolve(spec: ExperimentSpec, source: str | None = None) -> ResolvedSpec:
    """``spec`` resolved against the registries (plugins loaded first), or a ``SpecError``
    listing every problem of its components and of the method's view of the whole spec."""
    load_plugins()
    problems: list[tuple[str, str]] = []
    found = {
        "dataset": _validated(SOURCES, spec.dataset.name, spec.dataset.written(), "dataset.",
                              problems),
        "scenario": _validated(SCENARIOS, spec.scenario.name, spec.scenario.written(),
                               "scenario.", problems),
        "model": _validated(MODELS, spec.model.name, spec.model.written(), "model.", problems),
        "method": _validated(METHODS, spec.method.name, spec.method.params, "method.params.",
                             problems),
    }
    if found["method"] is not None:
        method, params = found["method"]
        problems.extend(_method_problems(spec, method, params))
    if problems:
        raise SpecError(problems, source)
    return ResolvedSpec(**{name: getattr(spec, name) for name in ExperimentSpec.model_fields},
                        method_class=found["method"][0], method_params=found["method"][1],
                        model_params=found["model"][1], dataset_params=found["dataset"][1],
                        scenario_params=found["scenario"][1])


def _method_problems(spec: ExperimentSpec, method: type[Method],
                     params: MethodParams) -> list[tuple[str, str]]:
    """What the method's class sees wrong in the whole spec: state that cannot move between
    workers, latent groups the scenario lacks, and the method's own ``check``."""
    problems = []
    if spec.resources.client_data == "replicated" and method.personal_state:
        problems.append(("resources.client_data", (
            f"{spec.method.name} keeps per-client state on the worker that hosts the client, "
            "so its clients cannot move between workers; use sharded or auto")))
    if "groups" in method.requires and spec.scenario.name in SCENARIOS and \
            not getattr(SCENARIOS.get(spec.scenario.name), "latent_groups", False):
        with_groups = [n for n in SCENARIOS.names()
                       if getattr(SCENARIOS.get(n), "latent_groups", False)]
        problems.append(("method.name", (
            f"{spec.method.name} needs the scenario's latent group labels; scenario "
            f"{spec.scenario.name!r} has none (use one of: {', '.join(with_groups)})")))
    return problems + method.check(spec, params)


def validate(raw: dict[str, Any], source: str | None = None) -> ResolvedSpec:
    """A raw spec (a preset merged under it) checked completely, structure then components,
    and resolved."""
    if not isinstance(raw, dict):
        raise SpecError([("", "a spec must be a mapping of fields")], source)
    return resolve(parse(_apply_preset(raw, source), source), source)


def _apply_preset(raw: dict[str, Any], source: str | None) -> dict[str, Any]:
    """Merge the named paper preset (raylf.data.presets) under the spec: explicit fields win."""
    if "preset" not in raw:
        return raw
    rest = {k: v for k, v in raw.items() if k != "preset"}
    name = raw["preset"]
    if not isinstance(name, str) or name not in presets.PRESETS:
        allowed = ", ".join(presets.names())
        raise SpecError([("preset", f"unknown preset {name!r}; allowed: {allowed}")], source)
    return presets.merge_under(presets.get(name), rest)


def load_spec(path: str | Path, overrides: list[str] = ()) -> ResolvedSpec:
    """A spec file with ``dotted.key=value`` overrides applied, validated and resolved."""
    raw = load_raw(path)
    if isinstance(raw, dict):
        for assignment in overrides:
            set_dotted(raw, assignment)
    return validate(raw, str(path))
