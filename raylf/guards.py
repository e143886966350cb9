"""Flags that keep a degenerate or stand-in result from reading as a real one.

- *identical*: two configurations of one setting whose per-client final test accuracies agree
  within ``NOISE`` on every seed both ran are one computation under two names (PACFL whose
  threshold merges every client is FedAvg); a table would otherwise show one result twice, as
  if two methods agreed.
- *collapsed*: a method's own diagnostics show it ran as a simpler method (one cluster, attention
  on itself, α on the target alone, memberships on one group); the flag names the parameter
  that decides it.
- *stand-in*: a setting any of whose trials ran on stand-in data (the trials table's
  ``data_origin``) is marked wherever its label appears, so a run on stand-ins is never read as
  a result on the real data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations

import pandas as pd

from raylf.stats import SEED_LEVEL

# Accuracies are ratios of counts: one computation gives equal floats, and 1e-6 absorbs float
# noise in the ratio while staying far below one test sample (1 / n_test).
NOISE = 1e-6
NEAR_ONE = 0.99  # a weight "≈ 1": ξ_ii, a target's own α
OWN_ALPHA = "own alpha"  # not a rounds column: SP-CACW's α_tt from its alpha table
STANDIN = "standin"
STANDIN_MARK = " [STAND-IN DATA]"
FLAG_COLUMNS = ["setting", "entry", "flag"]


def _at_most_one(values: pd.Series) -> pd.Series:
    return values <= 1


def _near_one(values: pd.Series) -> pd.Series:
    return values >= NEAR_ONE


@dataclass(frozen=True)
class Collapse:
    """A method ran as a simpler one when ``collapsed`` holds for every value of ``column``
    (every round that logged it, or every α update); not flagged where the trial asked for it,
    its ``asked`` parameter set to at most 1 (HDC-FL's one-prototype ablation, IFCA with one
    cluster model)."""

    column: str
    collapsed: Callable[[pd.Series], pd.Series]
    says: str
    parameters: tuple[str, ...]
    asked: str | None = None


COLLAPSES = {
    "pacfl": Collapse("clusters", _at_most_one, "one cluster: every client merged, PACFL ran as "
                      "FedAvg", ("threshold", "threshold_scale")),
    "ifca": Collapse("clusters_chosen", _at_most_one, "the participants chose one cluster model "
                     "on every round", ("clusters",), asked="clusters"),
    "fedsoft": Collapse("clusters_dominant", _at_most_one, "one cluster dominated every client "
                        "on every round", ("clusters", "lam"), asked="clusters"),
    "fedamp": Collapse("xi_self_mean", _near_one, "ξ_ii ≈ 1 on every round: FedAMP ran as local "
                       "training", ("sigma",)),
    "hdcfl": Collapse("groups_used", _at_most_one, "memberships on one group at every refresh",
                      ("groups", "temperature"), asked="groups"),
    "spcacw": Collapse(OWN_ALPHA, _near_one, "α = e_t at every update: SP-CACW ran as selfish "
                       "local training", ("beta", "gamma")),
    "spcacw_noreg": Collapse(OWN_ALPHA, _near_one, "α = e_t at every update: SP-CACW ran as "
                             "selfish local training", ("beta",)),
}


def _observed(column: str, rounds: pd.DataFrame, alpha: pd.DataFrame | None) -> pd.DataFrame:
    """``trial_id``, ``value``: the column's logged values, or each target's own α."""
    if column == OWN_ALPHA:
        if alpha is None or not {"trial_id", "target", "peer", "alpha"} <= set(alpha):
            return pd.DataFrame(columns=["trial_id", "value"])
        own = alpha[alpha["peer"] == alpha["target"]]
        return own[["trial_id", "alpha"]].rename(columns={"alpha": "value"})
    if column not in rounds:
        return pd.DataFrame(columns=["trial_id", "value"])
    return rounds[["trial_id", column]].dropna().rename(columns={column: "value"})


def collapsed(trials: pd.DataFrame, rounds: pd.DataFrame,
              alpha: pd.DataFrame | None = None) -> pd.DataFrame:
    """``FLAG_COLUMNS`` per (setting, entry) of ``trials`` (ok trials with ``setting``,
    ``entry``, ``method``) whose method's diagnostics collapsed on some seed, with how many."""
    flags = []
    for (setting, entry), group in trials.groupby(["setting", "entry"], sort=False):
        rule = COLLAPSES.get(group["method"].iloc[0])
        if rule is None:
            continue
        asked = f"method.params.{rule.asked}"
        if asked in group:
            group = group[~(group[asked] <= 1)]
        observed = _observed(rule.column, rounds, alpha)
        observed = observed[observed["trial_id"].isin(set(group["trial_id"]))]
        if observed.empty:
            continue
        per_trial = rule.collapsed(observed["value"].astype(float)) \
            .groupby(observed["trial_id"]).all()
        if per_trial.any():
            flags.append({"setting": setting, "entry": entry, "flag": (
                f"collapsed: {rule.says} ({int(per_trial.sum())} of {len(per_trial)} seeds); "
                f"look at {_parameters(group, rule.parameters)}")})
    return pd.DataFrame(flags, columns=FLAG_COLUMNS)


def _parameters(trials: pd.DataFrame, names: tuple[str, ...]) -> str:
    """``method.params.threshold (3.2)``: each parameter with the values these trials set."""
    parts = []
    for name in names:
        column = f"method.params.{name}"
        values = trials[column].dropna().unique() if column in trials else []
        shown = ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)
        parts.append(column + (f" ({shown})" if shown else " (its default)"))
    return " / ".join(parts)


def identical(values: pd.DataFrame) -> pd.DataFrame:
    """``FLAG_COLUMNS`` for both entries of every pair in one setting whose per-client values
    (``raylf.stats.paired_values`` rows at client level) agree within ``NOISE`` on every seed
    both ran, with the same clients on each."""
    values = values[values["client_id"] != SEED_LEVEL]
    flags = []
    for setting, here in values.groupby("setting", sort=False):
        grid = here.pivot_table(index=["seed", "client_id"], columns="entry", values="value",
                                aggfunc="mean", sort=False)
        seeds = grid.index.get_level_values("seed")
        for a, b in combinations(grid.columns, 2):
            shared = set(seeds[grid[a].notna()]) & set(seeds[grid[b].notna()])
            pair = grid.loc[seeds.isin(shared), [a, b]]
            if pair.empty or pair.isna().any().any() or \
                    (pair[a] - pair[b]).abs().max() > NOISE:
                continue
            clients = pair.index.get_level_values("client_id").nunique()
            for entry, other in ((a, b), (b, a)):
                flags.append({"setting": setting, "entry": entry, "flag": (
                    f"identical to {other}: the same per-client final test accuracy on every "
                    f"shared seed ({len(shared)} seeds × {clients} clients)")})
    return pd.DataFrame(flags, columns=FLAG_COLUMNS)


def flags(trials: pd.DataFrame, values: pd.DataFrame, rounds: pd.DataFrame,
          alpha: pd.DataFrame | None = None) -> pd.Series:
    """Every flag of every (setting, entry), joined by "; ", indexed by (setting, entry)."""
    found = pd.concat([identical(values), collapsed(trials, rounds, alpha)], ignore_index=True)
    return found.groupby(["setting", "entry"], sort=False)["flag"].agg("; ".join)


def standin_settings(trials: pd.DataFrame, settings: pd.Series) -> list[str]:
    """Settings (labels of ``settings``, aligned with ``trials``) any trial of which ran on
    stand-in data; none when the trials table has no ``data_origin``."""
    if "data_origin" not in trials:
        return []
    return list(dict.fromkeys(settings[trials["data_origin"] == STANDIN]))


def mark_standin(trials: pd.DataFrame, settings: pd.Series) -> pd.Series:
    """The setting labels, those of a stand-in setting ending in ``STANDIN_MARK``."""
    marked = set(standin_settings(trials, settings))
    return settings.map(lambda s: s + STANDIN_MARK if s in marked else s)


def standin_banner(settings: list[str]) -> str:
    return ("WARNING: stand-in data. " + ", ".join(s.removesuffix(STANDIN_MARK) for s in settings)
            + " ran on stand-in data (data_origin = standin), not on the real dataset: these "
            "numbers say nothing about the real data and are never a result to report.")
