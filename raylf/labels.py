"""The labels a sweep's trials are grouped by, shared by the console leaderboard and the report.

A *setting* is what the papers put in a table's columns (dataset × scenario × model, plus any
dataset, scenario, model or federation field the sweep varies): trials of one setting that share
a seed share the partition, which is what lets methods be compared paired by seed. A
*configuration* is a method with the method parameters the sweep varies for it. Here, not in
``raylf.report``, so the leaderboard, printed before any plotting library is imported, groups
exactly as the report does.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

SETTING_FIELDS = ("dataset.", "scenario.", "model.", "federation.", "eval_every")
METHOD_FIELDS = "method.params."
NOT_SETTINGS = ("dataset.name", "scenario.name", "model.name", "federation.divergence_loss")


def _varied(frame: pd.DataFrame, columns: list[str]) -> list[str]:
    return [c for c in columns if frame[c].map(str).nunique() > 1]


def _short(columns: list[str]) -> dict[str, str]:
    """The last dotted part, or the part after ``method.params.`` when the last is ambiguous."""
    last = [c.rsplit(".", 1)[-1] for c in columns]
    return {c: (s if last.count(s) == 1 else c.removeprefix(METHOD_FIELDS))
            for c, s in zip(columns, last)}


def _assignments(row: pd.Series, columns: dict[str, str]) -> str:
    return ", ".join(f"{name}={_value(row[c])}" for c, name in columns.items()
                     if not _missing(row[c]))


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and pd.isna(value))


def _value(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def setting_labels(trials: pd.DataFrame) -> pd.Series:
    """``dataset · scenario · model``, with the setting fields varied among the trials of that
    triple, e.g. ``(k=3)``."""
    base = trials["dataset"].astype(str) + " · " + trials["scenario"].astype(str) + " · " + \
        trials["model"].astype(str)
    fields = [c for c in trials if c.startswith(SETTING_FIELDS) and c not in NOT_SETTINGS]
    return _with_varied(trials, base, fields, "{} ({})")


def config_labels(trials: pd.DataFrame) -> pd.Series:
    """The method, with the method parameters varied among its own trials: ``fedprox(mu=0.1)``."""
    params = [c for c in trials if c.startswith(METHOD_FIELDS)]
    return _with_varied(trials, trials["method"].astype(str), params, "{}({})")


def _with_varied(trials: pd.DataFrame, names: pd.Series, fields: list[str],
                 form: str) -> pd.Series:
    """Each row's ``names`` entry, followed (as ``form``) by the ``fields`` that vary among the
    rows sharing that name."""
    labels = names.copy()
    for name, group in trials.groupby(names, sort=False):
        varied = _varied(group, [c for c in fields if group[c].notna().any()])
        if varied:
            short = _short(varied)
            assigned = group.apply(lambda row, n=short: _assignments(row, n), axis=1)
            labels[group.index] = [form.format(name, a) if a else name for a in assigned]
    return labels


def methods_with(trials: pd.DataFrame, trait: str) -> list[str]:
    """The methods whose trials record ``trait`` (the trials table's ``oracle``: references
    never ranked; ``proposed_in``: the papers' own methods, compared with every configuration):
    what a report knows of a method without importing it. Tables without the column: none."""
    if trait not in trials:
        return []
    marked = trials[trait].notna() & (trials[trait] != False)  # noqa: E712 - bools and titles
    return list(dict.fromkeys(trials.loc[marked, "method"]))


def point_label(point: dict[str, Any]) -> str:
    """``mu=0.01, lr=0.05``: each field by its last name, sampled floats to 4 digits."""
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={format(v, '.4g') if isinstance(v, float) else v}"
                     for k, v in point.items())
