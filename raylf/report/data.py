"""A sweep's result tables with the labels a report groups by.

A *setting* is what the papers put in a table's columns (dataset × scenario × model, plus any
dataset, scenario, model or federation field the sweep varies); a *configuration* is a method with
the method parameters the sweep varies for it. Seeds are the replicates averaged within both.
Multi-task trials have no plain ``acc_mean``: their headline is the mean over the tasks'
``acc_mean_<task>`` (the rule the sweep's leaderboard ranks by).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from raylf import results

SETTING_FIELDS = ("dataset.", "scenario.", "model.", "federation.", "eval_every")
METHOD_FIELDS = "method.params."
NOT_SETTINGS = ("dataset.name", "scenario.name", "model.name", "federation.divergence_loss")


@dataclass
class Sweep:
    """The tables of one sweep directory; ``trials`` carries ``setting``, ``config`` and the
    headline ``score``; ``rounds`` and ``clients`` carry the same labels by trial."""

    root: str
    trials: pd.DataFrame
    rounds: pd.DataFrame
    clients: pd.DataFrame
    extra: dict[str, pd.DataFrame]
    tasks: list[str]

    @property
    def ok(self) -> pd.DataFrame:
        """Trials that finished: the only ones any mean or rank is taken over."""
        return self.trials[self.trials["status"] == "ok"]

    @property
    def settings(self) -> list[str]:
        return list(dict.fromkeys(self.trials["setting"]))

    def deployables(self, method: str | None = None) -> list[str]:
        """In the order clients report them (of one method, or all)."""
        clients = self.clients
        if "deployable" not in clients:
            return []
        if method is not None:
            clients = clients[clients["method"] == method]
        return list(dict.fromkeys(clients["deployable"].dropna()))

    def primary_deployable(self, method: str) -> str | None:
        """The method's deployable whose metrics carry no ``_<deployable>`` suffix: the one
        reported (the others are e.g. ``acc_mean_own_heads``)."""
        trials = self.trials[self.trials["method"] == method].dropna(axis=1, how="all")
        tasks = set(self.clients.loc[self.clients["method"] == method, "task"].dropna())
        task = "" if tasks <= {"main"} else f"_{sorted(tasks - {'main'})[0]}"
        return next((d for d in self.deployables(method)
                     if f"acc_mean{task}_{d}" not in trials), None)


def load(root: str | Path) -> Sweep:
    tables = results.load(root)
    trials = tables.pop("trials")
    if trials.empty:
        raise ValueError(f"no trials under {root}/tables/trials/")
    rounds, clients = tables.pop("rounds"), tables.pop("clients")
    tasks = sorted(set(clients.get("task", pd.Series(dtype=str)).dropna()) - {"main"})
    trials = trials.assign(setting=setting_labels(trials), config=config_labels(trials))
    trials["score"] = headline(trials, "acc_mean", tasks)
    labels = trials[["trial_id", "setting", "config", "method", "seed", "status"]]
    if not rounds.empty:
        rounds = rounds.merge(labels, on="trial_id")
        rounds["score"] = headline(rounds, "acc_mean", tasks)
        if any(c.startswith("val_acc_mean") for c in rounds):
            rounds["val_score"] = headline(rounds, "val_acc_mean", tasks)
        trials = trials.merge(round_selections(rounds), on="trial_id", how="left")
    clients = clients.merge(labels, on="trial_id") if not clients.empty else clients
    extra = {name: frame.merge(labels, on="trial_id") for name, frame in tables.items()
             if "trial_id" in frame}
    return Sweep(str(root), trials, rounds, clients, extra, tasks)


def round_selections(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per trial: the maximum headline over evaluated rounds (selected on test data, as SP-CACW
    reports it) and, with a validation split, the round of the best validation headline (the
    first if tied) with its test headline: the figure to report."""
    evaluated = rounds.dropna(subset=["score"])
    by_trial = evaluated.groupby("trial_id")
    out = pd.DataFrame({"score_max": by_trial["score"].max()})
    if "val_score" in evaluated and evaluated["val_score"].notna().any():
        chosen = evaluated.loc[evaluated.dropna(subset=["val_score"])
                               .groupby("trial_id")["val_score"].idxmax()]
        out = out.join(chosen.set_index("trial_id")[["round", "val_score", "score"]].rename(
            columns={"round": "val_round", "val_score": "val_score_selected",
                     "score": "score_at_val"}))
    return out.reset_index()


def headline(frame: pd.DataFrame, metric: str, tasks: list[str]) -> pd.Series:
    """``metric`` where a row has it, else its mean over the tasks' ``<metric>_<task>``."""
    plain = frame[metric] if metric in frame else pd.Series(float("nan"), index=frame.index)
    per_task = [f"{metric}_{t}" for t in tasks if f"{metric}_{t}" in frame]
    if not per_task:
        return plain.astype(float)
    return plain.astype(float).fillna(frame[per_task].astype(float).mean(axis=1))


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
    labels = base.copy()
    fields = [c for c in trials if c.startswith(SETTING_FIELDS) and c not in NOT_SETTINGS]
    for triple, group in trials.groupby(base, sort=False):
        varied = _varied(group, [c for c in fields if group[c].notna().any()])
        if varied:
            names = _short(varied)
            assigned = group.apply(lambda row, n=names: _assignments(row, n), axis=1)
            labels[group.index] = [f"{triple} ({a})" if a else triple for a in assigned]
    return labels


def config_labels(trials: pd.DataFrame) -> pd.Series:
    """The method, with the method parameters varied among its own trials: ``fedprox(mu=0.1)``."""
    labels = trials["method"].astype(str).copy()
    params = [c for c in trials if c.startswith(METHOD_FIELDS)]
    for method, group in trials.groupby("method", sort=False):
        varied = _varied(group, [c for c in params if group[c].notna().any()])
        if varied:
            names = _short(varied)
            assigned = group.apply(lambda row, n=names: _assignments(row, n), axis=1)
            labels[group.index] = [f"{method}({a})" if a else method for a in assigned]
    return labels
