"""Paired comparisons of methods within a setting, and rank statistics across settings.

Trials of one setting that share a seed share the partition: the same clients holding the same
data. The difference between two methods on one seed and client therefore carries none of the
variation between partitions or between clients, so methods are compared on those differences:
their mean with a 95 % bootstrap interval (the seed × client pairs resampled, seeded) and
Wilcoxon's signed-rank test, which assumes no normality (a few clients' accuracies are bounded
and skewed; zero differences count, split between the signs). A method is *tied* with the best
of its setting when that test does not reject at ``ALPHA``: tables mark all of them rather than
bold one mean that noise put on top.

Across settings, methods are ranked only where they share the settings; a method alone in a
setting would otherwise take rank 1 by absence. Over the shared block: Friedman's test and
Nemenyi's critical difference of average ranks (Demšar, JMLR 2006), what benchmark papers show.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

ALPHA = 0.05
RESAMPLES = 2000
SEED_LEVEL = -1  # client_id of a value that is one per trial, not per client
COLUMNS = ["trial_id", "setting", "entry", "method", "seed", "client_id", "value"]


def reported_deployable(trials: pd.DataFrame, deployables: list[str],
                        tasks: set[str]) -> str | None:
    """Of ``deployables`` (in the order clients report them), the one a method reports: the one
    whose metrics in ``trials`` (rows of one method or trial) carry no ``_<deployable>`` suffix.
    The clients table's row order says nothing (Ditto's and FedAMP's shared-model rows may come
    first); the metric names are what the engine wrote (``raylf.metrics.summarize``)."""
    return _unsuffixed(set(trials.columns[trials.notna().any()]), deployables, tasks)


def _unsuffixed(present: set[str], deployables: list[str], tasks: set[str]) -> str | None:
    """:func:`reported_deployable` given the metric names that carry a value (``present``)."""
    task = "" if tasks <= {"main"} else f"_{sorted(tasks - {'main'})[0]}"
    return next((d for d in deployables if f"acc_mean{task}_{d}" not in present), None)


def reported_rows(clients: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """The clients-table rows of each trial's reported deployable (:func:`reported_deployable`)
    and test split; a trial absent from ``trials`` keeps all its test rows. Each trial's
    deployables and tasks are gathered in one pass over the rows, not a lookup a trial: a
    sweep of thousands of trials would pay one per trial in pandas' overhead."""
    rows = clients[clients["split"] == "test"] if "split" in clients else clients
    if rows.empty or "deployable" not in rows or "trial_id" not in trials:
        return rows
    valued = trials.set_index("trial_id").filter(like="acc_mean").notna()
    names = valued.columns.to_numpy()
    deployables = _first_seen(rows, "deployable")
    tasks = _first_seen(rows, "task") if "task" in rows else {}
    chosen = {trial_id: _unsuffixed(set(names[valued.loc[trial_id].to_numpy()]), order,
                                    set(tasks.get(trial_id, ())))
              for trial_id, order in deployables.items() if trial_id in valued.index}
    wanted = rows["trial_id"].map(chosen)
    return rows[wanted.isna() | (rows["deployable"] == wanted)]


def _first_seen(rows: pd.DataFrame, column: str) -> dict[str, list]:
    """Per trial, the values of ``column`` in the order its rows first show them."""
    seen: dict[str, list] = {}
    for trial_id, value in rows[["trial_id", column]].dropna().drop_duplicates().itertuples(
            index=False):
        seen.setdefault(trial_id, []).append(value)
    return seen


def client_accuracy(clients: pd.DataFrame, at: pd.Series | None = None) -> pd.DataFrame:
    """Per trial and client (``trial_id``, ``client_id``, ``value``): the test accuracy at the
    trial's last evaluated round, or at the round ``at`` gives by trial id; for a multi-task trial
    the mean over its tasks, as its headline. ``clients``: :func:`reported_rows`."""
    needed = {"trial_id", "client_id", "round", "accuracy"}
    if clients.empty or not needed <= set(clients):
        return pd.DataFrame(columns=["trial_id", "client_id", "value"])
    wanted = clients["trial_id"].map(at) if at is not None else \
        clients.groupby("trial_id")["round"].transform("max")
    rows = clients[clients["round"] == wanted]
    return (rows.groupby(["trial_id", "client_id"], as_index=False, sort=False)["accuracy"]
            .mean().rename(columns={"accuracy": "value"}))


def paired_values(trials: pd.DataFrame, value: str,
                  per_client: pd.DataFrame | None = None) -> pd.DataFrame:
    """What methods are paired on, one row per ``COLUMNS``: per client (from ``per_client``,
    :func:`client_accuracy`'s frame) in a setting where every trial has client values, else per
    seed (``client_id`` ``SEED_LEVEL``) from ``trials[value]``. ``trials`` are the trials to
    compare (ok ones) with ``setting``, ``entry`` (what is compared: a configuration), ``method``
    and ``seed``."""
    base = trials[["trial_id", "setting", "entry", "method", "seed"]]
    per_seed = base.assign(client_id=SEED_LEVEL, value=trials[value].astype(float))
    if per_client is None or per_client.empty:
        return per_seed.dropna(subset=["value"])[COLUMNS]
    covered = base["trial_id"].isin(set(per_client["trial_id"])) \
        .groupby(base["setting"]).transform("all")
    per_client_rows = base[covered].merge(per_client, on="trial_id")
    return pd.concat([per_client_rows, per_seed[~covered]], ignore_index=True) \
        .dropna(subset=["value"])[COLUMNS]


@dataclass(frozen=True)
class Paired:
    """``a − b`` over the pairs: mean, 95 % bootstrap interval, Wilcoxon's two-sided p."""

    delta: float
    low: float
    high: float
    p: float
    pairs: int

    @property
    def tied(self) -> bool:
        return bool(self.p >= ALPHA)


def differences(a: pd.Series, b: pd.Series) -> np.ndarray | None:
    """``a − b`` over the keys both have (None when they share none), rounded to 12 decimals:
    accuracies are fractions whose float differences would otherwise break the ties between
    equal differences that the signed-rank test counts."""
    both = pd.concat({"a": a, "b": b}, axis=1, join="inner").dropna()
    if both.empty:
        return None
    return np.round((both["a"] - both["b"]).to_numpy(float), 12)


def wilcoxon_method(d: np.ndarray) -> str:
    """How the signed-rank test is run on ``d``: ``exact`` (the exact null distribution) with
    at most 50 differences, none zero and no two of equal size; else ``asymptotic`` (the
    normal approximation with the tie correction). With zeros or ties scipy's "auto" would run
    an exhaustive permutation test for up to 13 pairs, seconds per call; the approximation
    stands in there."""
    tied = bool((d == 0).any()) or len(np.unique(np.abs(d))) < len(d)
    return "asymptotic" if tied or len(d) > 50 else "exact"


@dataclass(frozen=True)
class OneSided:
    """Wilcoxon's one-sided signed-rank test that the differences lie above (or below) a
    shift: its ``p``; ``p_min``, the smallest p the same test can give on these pairs (every
    difference on the tested side, with the same ranks, ties and zeros: ``2**-n`` for the
    exact test), so that a test that cannot reach a level with this many pairs says so; and
    the ``method`` run."""

    p: float
    p_min: float
    method: str


def one_sided(d: np.ndarray, shift: float, side: str) -> OneSided:
    """The test that ``d − shift`` is centred above zero (``side="greater"``) or below it
    (``"less"``); zero differences split their rank between the signs (``zsplit``)."""
    import scipy.stats  # as in :func:`paired`

    shifted = np.round(d - shift, 12)

    def p(x: np.ndarray) -> float:
        return float(scipy.stats.wilcoxon(x, zero_method="zsplit", method=wilcoxon_method(x),
                                          alternative=side).pvalue)
    sign = 1.0 if side == "greater" else -1.0
    if not shifted.any():  # not one difference from the shift: no evidence either way; what
        # the test could give is that of as many pairs of distinct sizes
        return OneSided(1.0, p(sign * np.arange(1.0, len(d) + 1)), wilcoxon_method(shifted))
    return OneSided(p(shifted), p(sign * np.abs(shifted)), wilcoxon_method(shifted))


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (statsmodels), for the claims a
    report decides on one sweep: each adjusted p can be read against ``ALPHA`` directly."""
    if not pvalues:
        return []
    from statsmodels.stats.multitest import multipletests

    return [float(p) for p in multipletests(np.asarray(pvalues, float), alpha=ALPHA,
                                            method="holm")[1]]


def paired(a: pd.Series, b: pd.Series, seed: int = 0) -> Paired | None:
    """``a`` against ``b``, both indexed by the pairing key (seed, client); None when they share
    no key. One pair has no interval (nan)."""
    import scipy.stats  # here, not at the top: 1 s of every sweep CLI's start on 2 cores

    d = differences(a, b)
    if d is None:
        return None
    low = high = math.nan
    if len(d) > 1:
        interval = scipy.stats.bootstrap(
            (d,), np.mean, n_resamples=RESAMPLES, method="percentile",
            rng=np.random.default_rng(seed)).confidence_interval
        low, high = float(interval.low), float(interval.high)
    # zsplit: a zero difference (a client both score alike, common on bounded accuracies) splits
    # its rank between the signs, so every pair counts and identical methods get p = 1
    p = float(scipy.stats.wilcoxon(d, zero_method="zsplit", method=wilcoxon_method(d)).pvalue) \
        if d.any() else 1.0
    return Paired(float(d.mean()), low, high, p, len(d))


VERSUS = ("delta", "low", "high", "p", "pairs")


def entry_series(values: pd.DataFrame) -> dict[str, pd.Series]:
    """Each entry's values of one setting (``paired_values`` rows) indexed by (seed, client):
    what :func:`paired` pairs two entries on."""
    return {entry: frame.groupby(["seed", "client_id"])["value"].mean()
            for entry, frame in values.groupby("entry", sort=False)}


def versus(values: pd.DataFrame, means: pd.Series, higher_is_better: bool = True,
           seed: int = 0, reproduced: tuple[str, ...] = ()) -> pd.DataFrame:
    """Per (setting, entry) of ``means`` (the table's figure, which picks the best): ``best``
    and ``paper`` (the setting's best entry of a ``reproduced`` method, a paper's own, if any
    ran; nan where a setting has one entry: nothing to compare), each entry minus them
    (``best_delta``, ``best_low``, ``best_high``, ``best_p``, ``best_pairs``, likewise
    ``paper_…``; nan against itself) and ``tied``: the best itself, or the paired test cannot
    tell it from the best."""
    means = means.dropna()
    rows = []
    for setting, here in means.groupby(level=0, sort=False):
        here = here.droplevel(0)
        if len(here) < 2:
            rows.append({"setting": setting, "entry": here.index[0], "tied": False})
            continue
        best = here.idxmax() if higher_is_better else here.idxmin()
        mine = values[values["setting"] == setting]
        series = entry_series(mine)
        method = mine.groupby("entry")["method"].first()
        papers = here[[e for e in here.index if method.get(e) in reproduced]]
        paper = None if papers.empty else (papers.idxmax() if higher_is_better
                                           else papers.idxmin())
        for entry in here.index:
            row = {"setting": setting, "entry": entry, "best": best, "paper": paper}
            against = {name: _against(series, entry, other, seed)
                       for name, other in (("best", best), ("paper", paper))}
            for name, result in against.items():
                if result is not None:
                    row |= {f"{name}_{field}": getattr(result, field) for field in VERSUS}
            row["tied"] = entry == best or (against["best"] is not None and against["best"].tied)
            rows.append(row)
    columns = ["setting", "entry", "best", "paper", "tied",
               *[f"{name}_{field}" for name in ("best", "paper") for field in VERSUS]]
    return pd.DataFrame(rows).reindex(columns=columns).set_index(["setting", "entry"])


def _against(series: dict[str, pd.Series], entry: str, other: str | None,
             seed: int) -> Paired | None:
    if other is None or other == entry or entry not in series or other not in series:
        return None
    return paired(series[entry], series[other], seed)


def shared_block(present: pd.DataFrame) -> tuple[list, list]:
    """The settings and entries to rank over, from ``present`` (entries × settings, True where
    an entry has a result): entries present in every chosen setting, at least two of them;
    settings where fewer than two entries ran never rank. Greedy: from all those settings, drop
    the one whose absence lets the most entries share the rest, keeping the largest block
    (settings × entries) seen. Empty lists when no two entries share a setting."""
    settings = [s for s in present if present[s].sum() >= 2]
    block: tuple[list, list] = ([], [])
    while settings:
        entries = list(present.index[present[settings].all(axis=1)])
        if len(entries) >= 2 and len(settings) * len(entries) > len(block[0]) * len(block[1]):
            block = (list(settings), entries)
        drop = max(settings, key=lambda s: int(
            present[[t for t in settings if t != s]].all(axis=1).sum()))
        settings = [s for s in settings if s != drop]
    return block


def average_ranks(means: pd.DataFrame, higher_is_better: bool = True) -> pd.Series:
    """Mean over ``means``' settings (columns) of each entry's (row's) rank within the setting,
    ties sharing the average rank."""
    return means.rank(ascending=not higher_is_better, method="average").mean(axis=1)


@dataclass(frozen=True)
class RankTest:
    """Friedman's test over a block of settings (blocks) × entries, with Nemenyi's critical
    difference: two average ranks further apart than ``cd`` differ at ``ALPHA``."""

    settings: list
    ranks: pd.Series  # average rank by entry, best first
    statistic: float
    p: float
    cd: float


def rank_test(means: pd.DataFrame, higher_is_better: bool = True) -> RankTest | None:
    """Over :func:`shared_block` of ``means`` (entries × settings); None unless the block has
    at least two settings and three entries (Friedman's test compares at least three)."""
    import scipy.stats  # as in :func:`paired`

    settings, entries = shared_block(means.notna())
    if len(settings) < 2 or len(entries) < 3:
        return None
    block = means.loc[entries, settings]
    with np.errstate(invalid="ignore", divide="ignore"):  # every setting tied: nan
        result = scipy.stats.friedmanchisquare(*block.to_numpy(float))
    k, n = len(entries), len(settings)
    q = scipy.stats.studentized_range.ppf(1 - ALPHA, k, np.inf) / math.sqrt(2)
    return RankTest(settings, average_ranks(block, higher_is_better).sort_values(),
                    float(result.statistic), float(result.pvalue),
                    float(q * math.sqrt(k * (k + 1) / (6 * n))))
