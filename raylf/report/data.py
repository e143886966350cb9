"""A sweep's result tables with the labels a report groups by.

A *setting* is what the papers put in a table's columns (dataset × scenario × model, plus any
dataset, scenario, model or federation field the sweep varies; marked when it ran on stand-in
data); a *configuration* is a method with the method parameters the sweep varies for it
(``raylf.labels``). Seeds are the replicates averaged within both.
Multi-task trials have no plain ``acc_mean``: their headline is the mean over the tasks'
``acc_mean_<task>`` (the rule the sweep's leaderboard ranks by).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from raylf import guards, results, stats
from raylf.labels import config_labels, methods_with, setting_labels

# the per-client figure behind a trial-level one, with the trials column naming its round
# (None: the last evaluated round); any other figure is compared per seed
PER_CLIENT = {"score": None, "score_at_val": "val_round"}


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
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> pd.DataFrame:
        """Trials that finished: the only ones any mean or rank is taken over."""
        return self.trials[self.trials["status"] == "ok"]

    @property
    def settings(self) -> list[str]:
        return list(dict.fromkeys(self.trials["setting"]))

    @property
    def standin(self) -> list[str]:
        """Settings that ran, in some trial, on stand-in data."""
        return [s for s in self.settings if s.endswith(guards.STANDIN_MARK)]

    def paired_values(self, value: str = "score") -> pd.DataFrame:
        """``raylf.stats.paired_values`` of the ok trials, configurations as the entries: per
        client for the headline (final or at the validation-selected round), else per seed."""
        ok = self.ok.assign(entry=self.ok["config"]).dropna(subset=[value])
        if value not in PER_CLIENT:
            return stats.paired_values(ok, value)
        round_column = PER_CLIENT[value]
        at = ok.set_index("trial_id")[round_column] if round_column else None
        return stats.paired_values(ok, value, stats.client_accuracy(self.reported_clients, at))

    def versus(self, value: str = "score", higher_is_better: bool = True) -> pd.DataFrame:
        """``raylf.stats.versus`` per (setting, configuration) on the seed mean of ``value``,
        computed once per figure (several tables mark from it)."""
        key = (value, higher_is_better)
        if key not in self._cache:
            means = self.ok.groupby(["setting", "config"], sort=False)[value].mean()
            self._cache[key] = stats.versus(self.paired_values(value), means,
                                             higher_is_better, reproduced=tuple(
                                                 methods_with(self.trials, "proposed_in")))
        return self._cache[key]

    def flags(self) -> pd.Series:
        """Degenerate-result flags (``raylf.guards``) by (setting, configuration), once."""
        if "flags" not in self._cache:
            ok = self.ok.assign(entry=self.ok["config"])
            self._cache["flags"] = guards.flags(ok, self.paired_values("score"), self.rounds,
                                                 self.extra.get("alpha"))
        return self._cache["flags"]

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
        tasks = set(self.clients.loc[self.clients["method"] == method, "task"].dropna())
        return stats.reported_deployable(self.trials[self.trials["method"] == method],
                                         self.deployables(method), tasks)

    @property
    def reported_clients(self) -> pd.DataFrame:
        """Test-split rows of each ok trial's reported deployable (``stats.reported_rows``):
        what any per-client comparison is made on."""
        if "reported_clients" not in self._cache:
            clients = self.clients
            if "status" in clients:
                clients = clients[clients["status"] == "ok"]
            self._cache["reported_clients"] = stats.reported_rows(clients, self.trials)
        return self._cache["reported_clients"]


def load(root: str | Path) -> Sweep:
    tables = results.load(root)
    trials = tables.pop("trials")
    if trials.empty:
        raise ValueError(f"no trials under {root}/tables/trials/")
    rounds, clients = tables.pop("rounds"), tables.pop("clients")
    tasks = sorted(set(clients.get("task", pd.Series(dtype=str)).dropna()) - {"main"})
    trials = trials.assign(setting=guards.mark_standin(trials, setting_labels(trials)),
                           config=config_labels(trials))
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
