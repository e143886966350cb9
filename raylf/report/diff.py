"""Why two results are not the same experiment: ``python -m raylf.report A B --diff``.

Each side is a sweep or experiment directory (local or a URI), or one trial of it written
``DIR#TRIAL_ID``. Every trial records its spec resolved (each default filled in) and its
environment in its trials row (``raylf.config.ExperimentSpec.resolved``,
``raylf.experiment.run_environment``), so the two sides are compared field by field: the set
of values each side holds, shown where they differ. The fields fall in four kinds, and the
first line says what the differences amount to:

- *protocol*: what the experiment is (dataset, scenario, model, method and its parameters,
  federation, evaluation), and the data's and partition's digests: any difference makes it
  another experiment;
- *environment*: the software and hardware it ran on (``env.*``): the same experiment in
  another environment, whose results may differ by float rounding or worse;
- *replicates*: the seeds;
- *run*: how it was run (its name, resources): no effect on results.
"""

from __future__ import annotations

import math

import pandas as pd

from raylf import results
from raylf.schema import ExperimentSpec

RUN_FIELDS = ("name", "resources")
DATA_DIGESTS = ("env.data_sha256", "env.partition_sha256")
KINDS = ("protocol", "environment", "replicates", "run")


def trials_of(target: str) -> pd.DataFrame:
    """The trials rows of ``DIR`` or of the one trial ``DIR#TRIAL_ID``; ValueError when there
    are none (no such directory or trial)."""
    root, _, trial_id = target.partition("#")
    trials = results.load(root)["trials"]
    if trial_id:
        trials = trials[trials["trial_id"] == trial_id] if "trial_id" in trials else trials[:0]
    if trials.empty:
        raise ValueError(f"{target}: no trials there" + (f" with id {trial_id!r}" if trial_id
                                                          else ""))
    return trials


def kind(column: str) -> str | None:
    """Which kind of field a trials column is (the module docstring), None for a result."""
    if column in DATA_DIGESTS:
        return "protocol"
    if column.startswith("env."):
        return "environment"
    if column == "seed":
        return "replicates"
    top = column.split(".", 1)[0]
    if top not in ExperimentSpec.model_fields:
        return None
    return "run" if top in RUN_FIELDS else "protocol"


def _values(trials: pd.DataFrame, column: str) -> list[str]:
    if column not in trials:
        return ["unset"]
    def text(value) -> str:
        missing = value is None or (isinstance(value, float) and math.isnan(value))
        return "unset" if missing else (f"{value:g}" if isinstance(value, float) else str(value))
    return sorted({text(v) for v in trials[column]})


def differences(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per field whose values differ between ``a`` and ``b`` (trials rows): its kind and each
    side's values, protocol first."""
    columns = [c for c in dict.fromkeys([*a.columns, *b.columns]) if kind(c)]
    rows = []
    for column in columns:
        left, right = _values(a, column), _values(b, column)
        if left != right:
            rows.append({"Field": column, "Kind": kind(column), "A": ", ".join(left),
                         "B": ", ".join(right)})
    frame = pd.DataFrame(rows, columns=["Field", "Kind", "A", "B"])
    order = frame["Kind"].map(KINDS.index)
    return frame.assign(_order=order).sort_values(["_order", "Field"]).drop(columns="_order")


def verdict(found: pd.DataFrame) -> str:
    """What the differences amount to, in one line."""
    kinds = set(found["Kind"])
    def fields(k: str) -> str:
        return ", ".join(found.loc[found["Kind"] == k, "Field"])
    if "protocol" in kinds:
        return f"not the same experiment: the protocol differs in {fields('protocol')}"
    if "environment" in kinds:
        return ("the same experiment in another environment: "
                f"{fields('environment')} differ")
    if kinds:
        return f"the same experiment (only {', '.join(sorted(kinds))} differ)"
    return "the same experiment, in the same environment"


def render(a: str, b: str) -> str:
    """The diff of ``a`` and ``b`` as Markdown: the verdict, then the differing fields."""
    found = differences(trials_of(a), trials_of(b))
    lines = [f"A: {a}", f"B: {b}", "", verdict(found)]
    if not found.empty:
        lines += ["", "| Field | Kind | A | B |", "|---|---|---|---|"]
        lines += [f"| {r.Field} | {r.Kind} | {r.A} | {r.B} |" for r in found.itertuples()]
    return "\n".join(lines)
