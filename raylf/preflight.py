"""Before anything runs: every spec's data and method built once, so that a dataset not fetched,
an unreadable file, a partition that leaves a client without data or a method that cannot be
built is a spec error of ``python -m raylf.run`` or of a sweep (naming the field), not a failed
run; and which datasets a run would read as stand-in content."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from raylf.config import ResolvedSpec
from raylf.errors import SpecError


@dataclass(frozen=True)
class DataCheck:
    """What :func:`check_runnable` found about the data: the datasets still to fetch (only when
    they were allowed to be missing) and where each loaded dataset's data come from."""

    missing: dict[str, str]  # dataset name → the cache root it was looked for in
    origins: dict[str, str]  # dataset name → SourceData.origin (real, standin, bundled, …)

    def standins(self) -> list[str]:
        return sorted(name for name, origin in self.origins.items() if origin == "standin")


def check_runnable(specs: list[ResolvedSpec], missing_ok: bool = False) -> DataCheck:
    """Build every spec's data and method once, before anything starts: a dataset that is not
    fetched, an unreadable file or a partition that leaves a client without data is reported
    like any other spec error (each dataset is loaded once, however many trials share it).
    With ``missing_ok`` (a plan, not a run) a dataset that is not fetched yet is listed in the
    result instead; its trials' partitions are then not checked."""
    from raylf.data import build_federation
    from raylf.data.cache import DatasetMissing, data_root
    from raylf.data.manifest import DatasetError
    from raylf.data.sources import load_source
    from raylf.runtime.blueprint import Blueprint

    sources: dict[str, Any] = {}
    methods_checked: set[str] = set()
    problems: list[tuple[str, str]] = []
    missing: dict[str, str] = {}
    origins: dict[str, str] = {}
    for spec in specs:
        key = json.dumps([spec.dataset.name, spec.dataset_params.model_dump(mode="json")])
        if key not in sources:
            try:
                sources[key] = load_source(spec.dataset.name, spec.dataset_params)
                origins[spec.dataset.name] = getattr(sources[key], "origin", "unknown")
            except DatasetMissing as err:
                sources[key] = None
                if missing_ok:
                    missing[spec.dataset.name] = str(data_root(getattr(spec.dataset_params,
                                                                       "root", None)))
                else:
                    problems.append(_dataset_problem(spec, err))
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
    return DataCheck(missing, origins)


def _dataset_problem(spec: ResolvedSpec, err: Exception) -> tuple[str, str]:
    """(field, message): a source's own errors may already start with the field they are about."""
    field, sep, rest = str(err).partition(": ")
    if sep and field == "dataset.path":
        return field, (f"{rest}; an npz needs arrays x (N samples) and y (N integer labels), "
                       "optionally y_<task>, client and split")
    if sep and field.startswith("dataset."):
        return field, rest
    text = str(err)
    return "dataset.name", text if repr(spec.dataset.name) in text else \
        f"{spec.dataset.name}: {text}"
