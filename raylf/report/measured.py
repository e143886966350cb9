"""What a sweep measured, in the terms of the papers' figures: per trial and per pair.

A paper's figure names a metric (``raylf.report.papers``); this module gives raylf's value of it
for every ok trial, and the values methods are paired on (per seed and client where the
clients table has them, else per seed: ``raylf.stats.paired_values``). Two things differ from
the report's own grouping, because the papers compare across them:

- *Settings count training in epochs.* A per-step method (SP-CACW, its reference rules, FC)
  counts rounds in optimizer steps, so the report's setting labels put it apart from the
  round-based baselines it is compared with in the same paper column. Here a per-step trial's
  rounds and evaluation period are converted to passes over its clients' data (steps divided
  by ⌈n_train / batch⌉, the median client's), so both kinds meet in one setting when they train
  for as many epochs.
- *Selfish targets.* Where a selfish method runs for some targets only (``targets: [0]``, the
  SP-CACW paper's protocol), it is scored on those clients while the baselines score everyone:
  in such a setting every method's accuracy is taken over the targets' rows of the clients
  table, and the client-level tail (worst, bottom 20 %, gap) is left undefined.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd

from raylf import guards, stats
from raylf.labels import setting_labels
from raylf.report.data import Sweep, headline
from raylf.report.tables import per_client_round_bytes

TAIL = ("acc_worst", "acc_bottom20", "acc_gap")
TARGETS = "method.params.targets"


def per_step(trials: pd.DataFrame) -> pd.Series:
    """Which trials count ``federation.rounds`` in optimizer steps (the trials table's
    ``round_unit``, written from ``Method.round_unit``; tables without it count rounds)."""
    unit = trials["round_unit"] if "round_unit" in trials else pd.Series("round", trials.index)
    return unit == "step"


def _whole(value: float):
    """A count of epochs as the labels print it: 40, not 40.0, when whole."""
    return int(value) if float(value).is_integer() else round(float(value), 2)


@dataclass
class Measured:
    """The ok trials of ``sweep`` with ``setting`` relabelled in epochs (marked when stand-in)
    and ``epochs`` (passes over each client's training data), and their metric values."""

    sweep: Sweep
    _means: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def trials(self) -> pd.DataFrame:
        trials = self.sweep.trials.copy()
        epochs = self._epochs(trials)
        steps = per_step(trials) & epochs.notna()
        relabelled = trials.copy()
        if steps.any():
            per_epoch = trials["federation.rounds"] / epochs
            relabelled["federation.rounds"] = relabelled["federation.rounds"].mask(steps, epochs)
            if "eval_every" in relabelled:
                relabelled["eval_every"] = relabelled["eval_every"].mask(
                    steps, trials["eval_every"] / per_epoch)
            for column in ("federation.rounds", "eval_every"):  # 40 either way, never 40.0
                if column in relabelled:
                    relabelled[column] = relabelled[column].map(
                        lambda v: v if pd.isna(v) else _whole(v))
        trials["setting"] = guards.mark_standin(trials, setting_labels(relabelled))
        trials["epochs"] = epochs
        trials["standin"] = trials["setting"].str.endswith(guards.STANDIN_MARK)
        return trials[trials["status"] == "ok"].reset_index(drop=True)

    def _epochs(self, trials: pd.DataFrame) -> pd.Series:
        """Rounds × local epochs; for a per-step method, steps / ⌈median n_train / batch⌉ (nan
        without the clients' n_train)."""
        rounds = trials["federation.rounds"].astype(float) if "federation.rounds" in trials \
            else pd.Series(np.nan, index=trials.index)
        local = trials.get("federation.local_epochs", pd.Series(1.0, index=trials.index))
        epochs = rounds * local.astype(float).fillna(1.0)
        clients = self.sweep.clients
        steps = per_step(trials)
        if steps.any():
            n_train = (clients.groupby("trial_id")["n_train"].median() if "n_train" in clients
                       else pd.Series(dtype=float))
            batch = trials.get("federation.batch_size", pd.Series(np.nan, index=trials.index))
            per_epoch = np.ceil(trials["trial_id"].map(n_train) / batch.astype(float)).clip(1)
            epochs[steps] = rounds[steps] / per_epoch[steps]
        return epochs

    @cached_property
    def targets(self) -> dict[str, list[int]]:
        """Per setting whose selfish methods run for some targets only: those clients."""
        if TARGETS not in self.trials:
            return {}
        out: dict[str, list[int]] = {}
        for setting, here in self.trials.groupby("setting", sort=False):
            chosen = set()
            for value in here[TARGETS].dropna():
                if value != "all":
                    chosen |= set(json.loads(value) if isinstance(value, str) else [value])
            if chosen:
                out[setting] = sorted(int(c) for c in chosen)
        return out

    @property
    def clients(self) -> pd.DataFrame:
        """The test rows of each ok trial's reported deployable (``Sweep.reported_clients``)."""
        return self.sweep.reported_clients

    @cached_property
    def _client_rounds(self) -> pd.DataFrame:
        """Per trial, round and client: its test accuracy with the reported deployable (mean
        over tasks), from the clients table."""
        clients = self.clients
        if clients.empty or not {"trial_id", "client_id", "round", "accuracy"} <= set(clients):
            return pd.DataFrame(columns=["trial_id", "round", "client_id", "value"])
        return (clients.groupby(["trial_id", "round", "client_id"], as_index=False)["accuracy"]
                .mean().rename(columns={"accuracy": "value"}))

    @cached_property
    def _targeted(self) -> pd.DataFrame:
        """Per trial of a targeted setting and round: the mean accuracy over its targets."""
        targets = pd.DataFrame([(s, c) for s, clients in self.targets.items() for c in clients],
                               columns=["setting", "client_id"])
        rows = (self._client_rounds.merge(self.trials[["trial_id", "setting"]], on="trial_id")
                .merge(targets, on=["setting", "client_id"]))
        return rows.groupby(["trial_id", "round"], as_index=False)["value"].mean()

    def values(self, metric: str) -> pd.Series:
        """raylf's value of ``metric`` per ok trial (by position in :attr:`trials`), nan where
        the trial has none."""
        trials = self.trials
        if metric == "acc_mean":
            out = trials["score"].astype(float)
        elif metric == "best_acc_mean":
            column = "best_acc_mean" if "best_acc_mean" in trials else "score_max"
            out = trials.get(column, pd.Series(np.nan, index=trials.index)).astype(float)
        elif metric == "bytes_up_per_client_round":
            kb = per_client_round_bytes(self.sweep).set_index("trial_id")["kb_up"]
            out = trials["trial_id"].map(kb).astype(float) * 1e3
        elif metric in TAIL:
            out = headline(trials, metric, self.sweep.tasks)
        elif metric not in trials and metric in self.sweep.rounds:
            out = trials["trial_id"].map(self._last_in_rounds(metric)).astype(float)
        else:
            out = trials.get(metric, pd.Series(np.nan, index=trials.index)).astype(float)
        targeted = trials["setting"].isin(self.targets)
        if targeted.any() and metric in ("acc_mean", "best_acc_mean", *TAIL):
            out = out.copy()
            out[targeted] = np.nan
            if metric in ("acc_mean", "best_acc_mean"):
                per_round = self._targeted.sort_values("round").groupby("trial_id")["value"]
                found = per_round.last() if metric == "acc_mean" else per_round.max()
                out[targeted] = trials.loc[targeted, "trial_id"].map(found)
        return out

    def _last_in_rounds(self, metric: str) -> pd.Series:
        """Per trial id, the last value of a rounds-table diagnostic that is written only on
        some rounds (HDC-FL's ``silhouette`` and ``ari_previous``, at each refresh): the state
        the run ended in."""
        rounds = self.sweep.rounds.dropna(subset=[metric]).sort_values("round")
        return rounds.groupby("trial_id")[metric].last()

    def best_rounds(self) -> pd.Series:
        """Per trial id, the round of its highest mean accuracy (over its targets where the
        setting has them): the round the test-selected maximum is read at."""
        best = self.trials.set_index("trial_id").get("best_round", pd.Series(dtype=float))
        targeted = self._targeted
        if not targeted.empty:
            at = targeted.loc[targeted.groupby("trial_id")["value"].idxmax()]
            best = best.astype(float).copy()
            best.update(at.set_index("trial_id")["round"].astype(float))
        return best

    def pairs(self, metric: str) -> pd.DataFrame:
        """``raylf.stats.paired_values`` rows (``entry`` = configuration) of ``metric``: per
        seed and client for a client-level accuracy, else per seed."""
        trials = self.trials.assign(entry=self.trials["config"], value=self.values(metric))
        trials = trials.dropna(subset=["value"])
        per_client = self._per_client(metric)
        if per_client is not None and self.targets:
            setting = per_client["trial_id"].map(trials.set_index("trial_id")["setting"])
            keep = [s not in self.targets or c in self.targets[s]
                    for s, c in zip(setting, per_client["client_id"])]
            per_client = per_client[keep]
        return stats.paired_values(trials, "value", per_client)

    def _per_client(self, metric: str) -> pd.DataFrame | None:
        clients = self.clients
        if metric == "acc_mean":
            return stats.client_accuracy(clients)
        if metric == "best_acc_mean":
            return stats.client_accuracy(clients, self.best_rounds())
        task = metric.removeprefix("acc_mean_")
        if metric.startswith("acc_mean_") and "task" in clients and task in self.sweep.tasks:
            return stats.client_accuracy(clients[clients["task"] == task])
        return None

    def means(self, metric: str) -> pd.DataFrame:
        """Per (setting, config): method, mean, sample std and count over ok seeds (computed
        once per metric: every figure and claim of it reads them)."""
        if metric not in self._means:
            trials = self.trials.assign(value=self.values(metric)).dropna(subset=["value"])
            grouped = trials.groupby(["setting", "config"], sort=False)
            out = grouped["value"].agg(["mean", "std", "count"])
            out["method"] = grouped["method"].first()
            self._means[metric] = out
        return self._means[metric]
