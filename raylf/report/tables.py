"""The papers' tables, computed from a ``Sweep``: numbers formatted, best and second marked.

Every mean and rank is over ``ok`` trials only; a configuration with fewer ok seeds than it
started carries a dagger and the trials that did not finish are listed on their own. Marks and
ranks are within a setting and need a second configuration there: in the accuracy tables bold
is the best and every configuration the paired test cannot tell from it (``raylf.stats``), and
ranks and macro averages across settings are taken only over configurations that share the
settings (never a rank of 1 by absence). A degenerate result (``raylf.guards``) carries a double
dagger. A function returns None when the columns its table needs are absent, so a table appears
as soon as a method writes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from raylf.guards import NOISE
from raylf.labels import methods_with
from raylf.report.data import Sweep, headline
from raylf.results import STATUSES
from raylf.stats import ALPHA, RESAMPLES, average_ranks, rank_test, shared_block

DAGGER = "†"
FLAGGED = "‡"


@dataclass
class Table:
    """``cells`` are strings; ``marks`` (same shape) hold ``best`` / ``second`` / ``""``."""

    title: str
    note: str
    cells: pd.DataFrame
    marks: pd.DataFrame | None = None

    def __post_init__(self):
        if self.marks is None:
            self.marks = pd.DataFrame("", index=self.cells.index, columns=self.cells.columns)


def percent(mean: float, std: float = float("nan")) -> str:
    if pd.isna(mean):
        return "-"
    return f"{100 * mean:.2f}" + ("" if pd.isna(std) else f" ± {100 * std:.2f}")


def number(value: float, digits: int = 2) -> str:
    return "-" if pd.isna(value) else f"{value:.{digits}f}"


def rank_marks(values: pd.Series, higher_is_better: bool = True) -> pd.Series:
    """``best`` for the top value, ``second`` for the next distinct one (ties share a mark)."""
    dense = values.rank(method="dense", ascending=not higher_is_better)
    return dense.map({1.0: "best", 2.0: "second"}).fillna("")


def setting_marks(values: pd.Series, higher_is_better: bool = True) -> pd.Series:
    """:func:`rank_marks` within each setting (the last index level, or the level named
    ``setting``), none in a setting with a single entry: nothing to be best against."""
    level = "setting" if "setting" in values.index.names else values.index.nlevels - 1
    marks = pd.Series("", index=values.index)
    for _, here in values.groupby(level=level, sort=False):
        if here.notna().sum() >= 2:
            marks[here.index] = rank_marks(here, higher_is_better)
    return marks


def paired_marks(means: pd.Series, tied: pd.Series, higher_is_better: bool = True) -> pd.Series:
    """Within one setting (``means`` by configuration): ``best`` on the best mean and on every
    configuration the paired test cannot tell from it (``tied``), ``second`` on the best of the
    others; nothing when a configuration is alone."""
    means = means.dropna()
    marks = pd.Series("", index=means.index)
    if len(means) < 2:
        return marks
    top = tied.reindex(means.index).fillna(False).astype(bool)
    top[means.idxmax() if higher_is_better else means.idxmin()] = True
    marks[top] = "best"
    rest = means[~top]
    if len(rest):
        marks[rest.index[rank_marks(rest, higher_is_better) == "best"]] = "second"
    return marks


TIE_NOTE = (f"Bold: per setting, the best and every configuration a paired test cannot tell "
            f"from it (Wilcoxon signed-rank, p ≥ {ALPHA}, uncorrected, paired by seed and client, "
            "by seed for a per-trial figure; see Paired statistics); underlined: the best of the "
            "others.")


def _flag_note(sweep: Sweep) -> str:
    return f" {FLAGGED}: degenerate result (see Checks)." if len(sweep.flags()) else ""


def _rank_note(settings: list, block: list, everyone: list) -> str:
    """Which configurations the ranks are over, and why the others have none."""
    if not block:
        return " No two configurations share a setting: nothing is ranked."
    where = (f"within each of the {len(settings)} settings {', '.join(settings)} "
             if len(settings) > 1 else f"within {settings[0]} ")
    left = [c for c in everyone if c not in block]
    return (f" Rank: {where}among the configurations that ran in all of them"
            + (", averaged over those settings" if len(settings) > 1 else "")
            + (f"; '-': not ranked ({', '.join(left)} do not share these settings)"
               if left else "") + ".")


def seed_stats(trials: pd.DataFrame, value: str, by: list[str]) -> pd.DataFrame:
    """Mean, sample std and count over seeds of ``value`` per group of ``by``."""
    return trials.groupby(by, sort=False)[value].agg(["mean", "std", "count"])


def _incomplete(sweep: Sweep, by: list[str]) -> pd.Series:
    """Groups where some trials did not end ``ok`` (their means are over fewer seeds)."""
    status = sweep.trials.groupby(by, sort=False)["status"]
    return status.apply(lambda s: bool((s != "ok").any()))


def per_setting(sweep: Sweep, value: str, title: str, note: str,
                higher_is_better: bool = True) -> Table | None:
    """Configurations × settings, mean ± std over seeds, average rank over the settings the
    ranked configurations share (HDC-FL paper, Table 1: ranked within each setting, then averaged);
    bold the best and those tied with it by the paired test, underline the best of the rest."""
    ok = sweep.ok.dropna(subset=[value])
    if ok.empty:
        return None
    stats = seed_stats(ok, value, ["config", "setting"])
    means = stats["mean"].unstack("setting")
    stds = stats["std"].unstack("setting")
    settings = [s for s in sweep.settings if s in means]
    means, stds = means[settings], stds[settings]
    ranked_settings, block = shared_block(means.notna())
    ranks = average_ranks(means.loc[block, ranked_settings], higher_is_better).sort_values()
    order = [*ranks.index, *[c for c in means.index if c not in ranks.index]]
    incomplete = _incomplete(sweep, ["config", "setting"])
    flagged = set(sweep.flags().index)
    tied = sweep.versus(value, higher_is_better)["tied"]
    cells = pd.DataFrame(index=order)
    marks = pd.DataFrame(index=order)
    for setting in settings:
        cells[setting] = [percent(means.at[c, setting], stds.at[c, setting])
                          + (DAGGER if incomplete.get((c, setting), False) else "")
                          + (FLAGGED if (setting, c) in flagged else "") for c in order]
        marks[setting] = paired_marks(means[setting], tied.get(setting, pd.Series(dtype=bool)),
                                      higher_is_better).reindex(order)
    if cells.map(lambda text: DAGGER in text).any().any():
        note += f" {DAGGER}: some seeds did not finish (see the failed-trials section)."
    note += " " + TIE_NOTE + _rank_note(ranked_settings, block, order) + _flag_note(sweep)
    if block:
        rank_column = "Avg. rank ↓" if len(ranked_settings) > 1 else "Rank ↓"
        cells[rank_column] = [number(ranks.get(c, float("nan"))) for c in order]
        marks[rank_column] = rank_marks(ranks, higher_is_better=False).reindex(order)
    return _labelled(Table(title, note, cells, marks.fillna("")), "Method")


def _labelled(table: Table, *names: str) -> Table:
    """Move the index into leading label columns (unmarked)."""
    cells = table.cells.rename_axis(list(names)).reset_index()
    marks = table.marks.rename_axis(list(names)).reset_index()
    for name in names:
        marks[name] = ""
    return Table(table.title, table.note, cells, marks)


def trial_metric(sweep: Sweep, metric: str) -> pd.Series:
    return headline(sweep.trials, metric, sweep.tasks)


def main_table(sweep: Sweep) -> Table | None:
    return per_setting(
        sweep, "score", "Mean client test accuracy (%), final round",
        "Mean ± sample standard deviation over seeds." + _task_note(sweep))


def _task_note(sweep: Sweep) -> str:
    return (f" Multi-task trials: the mean over the tasks ({', '.join(sweep.tasks)})."
            if sweep.tasks else "")


TAIL_COLUMNS = {"acc_mean": "Mean", "acc_worst": "Worst", "acc_bottom20": "Bot.20%",
                "acc_gap": "Gap"}


def tail_tables(sweep: Sweep) -> list[Table]:
    """The macro-averaged tail table (HDC-FL paper, Table 2), over the settings the ranked
    configurations share, and, with several settings, worst, bottom-20 % and gap per setting
    (Tables 7–9)."""
    trials = sweep.trials.assign(**{f"tail_{m}": trial_metric(sweep, m) for m in TAIL_COLUMNS})
    ok = trials[trials["status"] == "ok"].dropna(subset=[f"tail_{m}" for m in TAIL_COLUMNS])
    if ok.empty:
        return []
    seed_means = ok.groupby(["config", "setting"])[[f"tail_{m}" for m in TAIL_COLUMNS]].mean()
    settings, block = shared_block(seed_means["tail_acc_mean"].unstack("setting").notna())
    everyone = list(dict.fromkeys(seed_means.index.get_level_values("config")))
    if block:
        seed_means = seed_means[seed_means.index.isin(block, level="config")
                                & seed_means.index.isin(settings, level="setting")]
    macro = seed_means.groupby("config").mean()
    order = pd.Index(everyone)
    if block:
        tail_ranks = pd.concat([
            seed_means["tail_acc_worst"].groupby("setting").rank(ascending=False),
            seed_means["tail_acc_bottom20"].groupby("setting").rank(ascending=False),
            seed_means["tail_acc_gap"].groupby("setting").rank(ascending=True),
        ], axis=1).mean(axis=1).groupby("config").mean()
        order = tail_ranks.sort_values().index
    cells, marks = pd.DataFrame(index=order), pd.DataFrame(index=order)
    for metric, label in TAIL_COLUMNS.items():
        cells[label] = [percent(v) for v in macro.loc[order, f"tail_{metric}"]]
        marks[label] = rank_marks(macro[f"tail_{metric}"], metric != "acc_gap")[order] \
            if block else ""
    if block:
        cells["Tail rank ↓"] = [number(v) for v in tail_ranks[order]]
        marks["Tail rank ↓"] = rank_marks(tail_ranks, higher_is_better=False)[order]
        over = (f"the {len(settings)} settings {', '.join(settings)}, which "
                f"{', '.join(block)} all ran" + (
                    f" (not shown: {', '.join(c for c in everyone if c not in block)}, which "
                    "do not share them; see the per-setting tables)"
                    if len(block) < len(everyone) else ""))
        how = ("Per setting the seed mean, then the unweighted mean over " + over + ". Tail "
               "rank: the rank on worst, bottom-20 % (higher better) and gap (lower better) "
               "within each setting, averaged over the three and over settings.")
    else:
        how = ("Per setting the seed mean, then the unweighted mean over each configuration's "
               "own settings. No two configurations share a setting: nothing is ranked.")
    tables = [_labelled(Table("Client-level results (%), macro-averaged over settings",
                              how + _task_note(sweep), cells, marks), "Method")]
    if len(sweep.settings) > 1:
        sweep_with_tails = Sweep(sweep.root, trials, sweep.rounds, sweep.clients, sweep.extra,
                                 sweep.tasks, _cache=sweep._cache)  # its flags are the same
        for metric in ("acc_worst", "acc_bottom20", "acc_gap"):
            table = per_setting(sweep_with_tails, f"tail_{metric}",
                                f"{TAIL_COLUMNS[metric]} client test accuracy (%) per setting",
                                "Mean ± sample std over seeds; ranked within each setting "
                                f"({'lower' if metric == 'acc_gap' else 'higher'} is better); "
                                "one figure per trial, so the paired test pairs by seed only.",
                                higher_is_better=metric != "acc_gap")
            tables.append(table)
    return tables


def max_over_rounds(sweep: Sweep) -> Table | None:
    """SP-CACW's reading (SP-CACW paper, Table 1): the maximum over evaluated rounds of each seed's
    mean accuracy, next to the final one. Selected on test data, so labelled as such."""
    if "score_max" not in sweep.trials:
        return None
    ok = sweep.ok.dropna(subset=["score_max"])
    if ok.empty:
        return None
    final = seed_stats(ok, "score", ["config", "setting"])
    best = seed_stats(ok, "score_max", ["config", "setting"])
    order = best["mean"].sort_values(ascending=False).index
    cells = pd.DataFrame({
        "Max over rounds (test-selected)": [percent(best.at[i, "mean"], best.at[i, "std"])
                                            for i in order],
        "Final": [percent(final.at[i, "mean"], final.at[i, "std"]) for i in order],
        "Seeds": [str(int(best.at[i, "count"])) for i in order],
    }, index=pd.MultiIndex.from_tuples(order, names=["config", "setting"]))
    marks = pd.DataFrame("", index=cells.index, columns=cells.columns)
    marks["Max over rounds (test-selected)"] = setting_marks(best["mean"])[order].values
    marks["Final"] = setting_marks(final["mean"])[order].values
    return _labelled(Table(
        "Maximum over rounds vs final mean accuracy (%)",
        "Per seed the highest mean accuracy over the evaluated rounds (test-selected: an "
        "optimistic figure, the way SP-CACW reports it), then mean ± sample std over seeds; "
        "bold: best, underlined: second within a setting.",
        cells, marks), "Method", "Setting")


def leaderboard(sweep: Sweep) -> Table | None:
    """Configurations ranked within each setting by the test accuracy at the
    validation-selected round where the rounds have a validation split, else by the final
    round; never by a test-selected round. Ties with the best from the paired test on that
    figure, per client at the round each trial selected."""
    ok = sweep.ok.dropna(subset=["score"])
    if ok.empty:
        return None
    selected = "score_at_val" in ok and ok["score_at_val"].notna().any()
    key = "score_at_val" if selected else "score"
    stats = {name: seed_stats(ok, name, ["config", "setting"])
             for name in ("score", "score_max", "score_at_val", "val_score_selected",
                          "val_round") if name in ok}
    position = {s: i for i, s in enumerate(sweep.settings)}
    means = stats[key]["mean"]
    order = sorted(means.index, key=lambda i: (position[i[1]], -means.fillna(-1.0)[i]))
    columns = {}
    if selected:
        columns["Test acc at val-selected round"] = "score_at_val"
        columns["Val acc"] = "val_score_selected"
    columns["Final"] = "score"
    if "score_max" in stats:
        columns["Max over rounds (test-selected)"] = "score_max"
    cells = pd.DataFrame({label: [percent(stats[name].at[i, "mean"], stats[name].at[i, "std"])
                                  for i in order] for label, name in columns.items()},
                         index=pd.MultiIndex.from_tuples(order, names=["config", "setting"]))
    if selected:
        cells.insert(2, "Selected round", [number(stats["val_round"].at[i, "mean"], 1)
                                           for i in order])
    cells["Seeds ok"] = [str(int(stats["score"].at[i, "count"])) for i in order]
    first = next(iter(columns))
    flagged = set(sweep.flags().index)
    cells[first] = [text + (FLAGGED if (setting, config) in flagged else "")
                    for text, (config, setting) in zip(cells[first], order)]
    marks = pd.DataFrame("", index=cells.index, columns=cells.columns)
    tied = sweep.versus(key)["tied"]
    for setting in sweep.settings:
        here = means[means.index.get_level_values("setting") == setting].droplevel("setting")
        marks.loc[[(c, setting) for c in here.index], first] = paired_marks(
            here, tied.get(setting, pd.Series(dtype=bool))).reindex(here.index).fillna("").values
    how = ("the test accuracy at the round with the best validation accuracy (first if tied); "
           "selection never looks at test data" if selected else
           "the final round (no validation split in these tables: "
           "set scenario.val_fraction to select rounds on validation data)")
    return _labelled(Table(
        "Leaderboard" + (" (validation-selected round)" if selected else " (final round)"),
        f"Ranked within each setting by {how}. Mean ± sample std over seeds (%); the "
        "max-over-rounds column is selected on test data and shown for reference only. "
        + TIE_NOTE + _task_note(sweep) + _flag_note(sweep),
        cells, marks), "Method", "Setting")


def _difference(row: pd.Series, name: str) -> str:
    """``−1.23 [−2.00, −0.50]``: the paired mean difference and its interval, in points."""
    delta, low, high = (row[f"{name}_{f}"] for f in ("delta", "low", "high"))
    interval = "" if pd.isna(low) else f" [{100 * low:+.2f}, {100 * high:+.2f}]"
    return f"{100 * delta:+.2f}{interval}"


def _test(row: pd.Series, name: str) -> str:
    return f"p = {row[f'{name}_p']:.2g} ({int(row[f'{name}_pairs'])} pairs)"


def paired_statistics(sweep: Sweep) -> Table | None:
    """Per setting with two or more configurations: each against the best and against the
    paper's method, paired by seed and client."""
    versus = sweep.versus("score")
    ranked = versus[versus["best"].notna()]
    if ranked.empty:
        return None
    means = sweep.ok.groupby(["setting", "config"], sort=False)["score"].mean()
    position = {s: i for i, s in enumerate(sweep.settings)}
    order = sorted(ranked.index, key=lambda i: (position[i[0]], -means[i]))
    rows = []
    for setting, config in order:
        row = ranked.loc[(setting, config)]
        cells = {"Setting": setting, "Method": config, "Mean": percent(means[(setting, config)])}
        for name, label in (("best", "best"), ("paper", "paper's method")):
            other = row[name]
            if pd.isna(other):
                cells |= {f"vs {label}": "-", f"vs {label}: Δ [95 % CI]": "-",
                          f"vs {label}: Wilcoxon": "-"}
                continue
            cells[f"vs {label}"] = ("tied: " if name == "best" and row["tied"]
                                    and other != config else "") + (
                "itself" if other == config else other)
            known = other != config and pd.notna(row[f"{name}_pairs"])
            cells[f"vs {label}: Δ [95 % CI]"] = _difference(row, name) if known else "-"
            cells[f"vs {label}: Wilcoxon"] = _test(row, name) if known else "-"
        rows.append(cells)
    cells = pd.DataFrame(rows)
    marks = pd.DataFrame("", index=cells.index, columns=cells.columns)
    for setting in dict.fromkeys(cells["Setting"]):
        here = cells["Setting"] == setting
        configs = cells.loc[here, "Method"]
        marks.loc[here, "Mean"] = paired_marks(
            means[setting].reindex(configs), versus.loc[setting, "tied"].reindex(configs)).values
    papers = ", ".join(methods_with(sweep.trials, "proposed_in")) or "none ran"
    return Table(
        "Paired statistics (final round)",
        "Trials of one setting that share a seed share the partition, so each configuration is "
        "compared with the setting's best and with the paper's method (the best-scoring of "
        f"{papers} that ran there) on the differences per seed and client. Δ: mean difference "
        "in points of client test accuracy (this minus that), with a 95 % percentile bootstrap "
        f"interval over the seed × client pairs ({RESAMPLES} resamples, seed 0); Wilcoxon: the "
        "two-sided signed-rank p over the same pairs and their count (pairs that share a "
        "seed share the federation, so p is optimistic). Tied: p ≥ "
        f"{ALPHA}, uncorrected for the several comparisons. Settings with a single "
        "configuration are left out: nothing to compare.", cells, marks)


def rank_summary(sweep: Sweep) -> str:
    """Friedman's test over the settings the configurations share, or why there is none."""
    means = sweep.ok.groupby(["config", "setting"], sort=False)["score"].mean().unstack("setting")
    test = rank_test(means)
    if test is None:
        settings, block = shared_block(means.notna())
        return ("Friedman's test and the critical-difference diagram need at least 2 settings "
                f"shared by at least 3 configurations; the largest shared block here is "
                f"{len(settings)} setting(s) × {len(block)} configuration(s).")
    ranks = ", ".join(f"{c} {r:.2f}" for c, r in test.ranks.items())
    return (f"Over the {len(test.settings)} settings {', '.join(test.settings)}, shared by "
            f"{len(test.ranks)} configurations (the others are not ranked): average rank of "
            f"the final mean client accuracy {ranks}. Friedman's test: χ² = "
            f"{test.statistic:.2f}, p = {test.p:.2g}. Nemenyi's critical difference at "
            f"α = {ALPHA}: {test.cd:.2f} (average ranks further apart differ).")


def checks(sweep: Sweep) -> Table | None:
    """Degenerate results: configurations identical to another, or collapsed by their own
    diagnostics (``raylf.guards``)."""
    flags = sweep.flags()
    if flags.empty:
        return None
    cells = pd.DataFrame({"Setting": flags.index.get_level_values("setting"),
                          "Method": flags.index.get_level_values("entry"),
                          "Flag": flags.values})
    return Table("Degenerate results",
                 f"Identical: the same per-client final test accuracy (within {NOISE:g}) on every "
                 "seed both ran, i.e. one computation under two names. Collapsed: the method's own "
                 "diagnostics show it ran as a simpler method; the parameter named decides it. "
                 f"Marked {FLAGGED} in the accuracy tables.", cells)


def per_client_round_bytes(sweep: Sweep) -> pd.DataFrame:
    """Per trial: bytes up and down per participating client per training round (round 0, a
    setup phase, counted apart)."""
    rounds = sweep.rounds
    if rounds.empty or "bytes_up" not in rounds:
        return pd.DataFrame(columns=["trial_id", "kb_up", "kb_down", "setup_kb_up"])
    training = rounds[rounds["round"] >= 1].groupby("trial_id")
    out = pd.DataFrame({
        "kb_up": training["bytes_up"].sum() / training["participants"].sum() / 1e3,
        "kb_down": training["bytes_down"].sum() / training["participants"].sum() / 1e3,
    })
    setup = rounds[rounds["round"] == 0].groupby("trial_id")["bytes_up"].sum()
    out["setup_kb_up"] = setup.reindex(out.index) / 1e3
    return out.reset_index()


def communication(sweep: Sweep) -> Table | None:
    ok = sweep.ok.merge(per_client_round_bytes(sweep), on="trial_id")
    if ok.empty:
        return None
    grouped = ok.groupby(["config", "setting"], sort=False)
    stats = grouped[["kb_up", "kb_down", "setup_kb_up"]].mean()
    stats["total_mb"] = grouped[["bytes_up", "bytes_down"]].mean().sum(axis=1) / 1e6
    order = stats["kb_up"].sort_values().index
    cells = pd.DataFrame({
        "KB up / client / round": [number(v) for v in stats.loc[order, "kb_up"]],
        "KB down / client / round": [number(v) for v in stats.loc[order, "kb_down"]],
        "MB per trial (up + down)": [number(v) for v in stats.loc[order, "total_mb"]],
    }, index=order)
    if stats["setup_kb_up"].notna().any():
        cells["Setup KB up (round 0)"] = [number(v) for v in stats.loc[order, "setup_kb_up"]]
    return _labelled(Table(
        "Communication", "What a participating client sends and receives per training round "
        "(KB = 1000 bytes), mean over seeds; the per-trial total over all clients and rounds.",
        cells), "Method", "Setting")


def per_task(sweep: Sweep) -> Table | None:
    """FMT-SVM's layout (FMT-SVM paper, Tables 3–6): per task accuracy and AUC for every deployable,
    with bytes per client per round."""
    if not sweep.tasks:
        return None
    ok = sweep.ok.merge(per_client_round_bytes(sweep), on="trial_id", how="left")
    rows, numbers = [], []
    pairs = [(m, d) for m in dict.fromkeys(ok["method"]) for d in sweep.deployables(m)]
    for method, deployable in pairs:
        primary = sweep.primary_deployable(method)
        suffix = "" if deployable == primary else f"_{deployable}"
        wanted = {f"{task} {kind}": f"{metric}_{task}{suffix}" for task in sweep.tasks
                  for kind, metric in (("acc", "acc_mean"), ("AUC", "auc_mean"))}
        wanted = {label: c for label, c in wanted.items() if c in ok and ok[c].notna().any()}
        if not wanted:
            continue
        scored = ok[ok["method"] == method].dropna(subset=list(wanted.values()), how="all")
        grouped = scored.groupby(["config", "setting"], sort=False)
        means, stds = grouped[list(wanted.values())].mean(), grouped[list(wanted.values())].std()
        kb = grouped[["kb_up", "kb_down"]].mean()
        for key in means.index:
            row = {"Method": key[0], "Setting": key[1], "Deployable": deployable}
            row |= {label: percent(means.at[key, c], stds.at[key, c])
                    for label, c in wanted.items()}
            numbers.append({label: means.at[key, c] for label, c in wanted.items()})
            row["KB up / client / round"] = number(kb.at[key, "kb_up"])
            row["KB down / client / round"] = number(kb.at[key, "kb_down"])
            rows.append(row)
    if not rows:
        return None
    cells = pd.DataFrame(rows).fillna("-")
    marks = pd.DataFrame("", index=cells.index, columns=cells.columns)
    numeric = pd.DataFrame(numbers, index=pd.MultiIndex.from_arrays(
        [cells.index, cells["Setting"]], names=["row", "setting"]))
    for label in numeric:
        marks[label] = setting_marks(numeric[label]).values
    return Table(
        "Per-task accuracy and AUC (%), final round",
        f"Tasks: {', '.join(sweep.tasks)}; one row per deployable (the model each client is "
        "scored with; the first of a method is the reported one). Mean ± sample std over seeds; "
        "bold: best, underlined: second per column within a setting. Bytes: per participating "
        "client per training round.",
        cells, marks)


DP_COLUMNS = ("dp_epsilon_round", "dp_epsilon_achieved", "dp_epsilon_composed", "dp_sigma",
              "dp_delta")


def privacy(sweep: Sweep) -> Table | None:
    """Accuracy against ε (FMT-SVM paper, Table 7) with the ε the noise achieves per round and the
    ε composed over all rounds (privacy accounting of the whole run, not one round)."""
    rounds = sweep.rounds
    if "dp_epsilon_composed" not in rounds:
        return None
    last = rounds.sort_values("round").groupby("trial_id").last()
    dp = last[[c for c in DP_COLUMNS if c in last]].reset_index()
    ok = sweep.ok.merge(dp, on="trial_id")
    if ok.empty:
        return None
    accuracy = {"Acc": "score", **{f"{t} acc": f"acc_mean_{t}" for t in sweep.tasks
                                   if f"acc_mean_{t}" in ok}}
    grouped = ok.groupby(["config", "setting"], sort=False, dropna=False)
    means, stds = grouped[list(accuracy.values())].mean(), grouped[list(accuracy.values())].std()
    eps = grouped[[c for c in DP_COLUMNS if c in ok]].first()
    order = eps["dp_epsilon_round"].sort_values(ascending=False, na_position="first").index
    cells = pd.DataFrame(index=order)
    cells["ε per round"] = [("∞ (no DP)" if pd.isna(v) else number(v))
                            for v in eps.loc[order, "dp_epsilon_round"]]
    cells["ε achieved / round"] = [number(v) for v in eps.loc[order, "dp_epsilon_achieved"]]
    cells["ε composed (all rounds)"] = [number(v) for v in eps.loc[order, "dp_epsilon_composed"]]
    cells["σ"] = [number(v, 3) for v in eps.loc[order, "dp_sigma"]]
    cells["δ"] = [("-" if pd.isna(v) else f"{v:g}") for v in eps.loc[order, "dp_delta"]]
    for label, column in accuracy.items():
        cells[label] = [percent(means.at[i, column], stds.at[i, column]) for i in order]
    cells["Seeds ok"] = grouped.size()[order].astype(str).values
    cells.index = pd.MultiIndex.from_tuples(order, names=["config", "setting"])
    return _labelled(Table(
        "Accuracy against the privacy budget (%), final round",
        "ε per round: the requested budget; achieved: the ε the noise σ gives one round at δ; "
        "composed: the ε of all rounds together at δ for a client in every round (PLD "
        "accountant). Mean ± sample std over ok seeds; diverged DP trials are listed apart.",
        cells), "Method", "Setting")


def alpha_support(sweep: Sweep, threshold: float = 1e-6) -> pd.DataFrame | None:
    """Per trial and round: the mean over targets of how many peers carry α above
    ``threshold`` (SP-CACW's learned sparsity)."""
    alpha = sweep.extra.get("alpha")
    if alpha is None or not {"alpha", "target", "round"} <= set(alpha):
        return None
    support = (alpha.assign(active=alpha["alpha"] > threshold)
               .groupby(["trial_id", "config", "setting", "round", "target"])["active"].sum())
    return support.groupby(["trial_id", "config", "setting", "round"]).mean().rename(
        "support").reset_index()


def alpha_table(sweep: Sweep) -> Table | None:
    support = alpha_support(sweep)
    if support is None or support.empty:
        return None
    ordered = support.sort_values("round").groupby("trial_id")
    per_trial = pd.DataFrame({"first": ordered["support"].first(),
                              "last": ordered["support"].last()}).join(
        support.groupby("trial_id")[["config", "setting"]].first())
    grouped = per_trial.groupby(["config", "setting"], sort=False)
    means, stds = grouped[["first", "last"]].mean(), grouped[["first", "last"]].std()
    cells = pd.DataFrame({
        "α support, first update": [number(m) + ("" if pd.isna(s) else f" ± {s:.2f}")
                                    for m, s in zip(means["first"], stds["first"])],
        "α support, last update": [number(m) + ("" if pd.isna(s) else f" ± {s:.2f}")
                                   for m, s in zip(means["last"], stds["last"])],
    }, index=means.index)
    return _labelled(Table(
        "α support (peers with non-zero weight per target)",
        "Mean over targets, then mean ± sample std over seeds.", cells), "Method", "Setting")


def statuses(sweep: Sweep) -> Table:
    counts = (sweep.trials.groupby(["config", "setting"], sort=False)["status"]
              .value_counts().unstack(fill_value=0))
    counts = counts.reindex(columns=[*STATUSES, *[c for c in counts if c not in STATUSES]],
                            fill_value=0)
    return _labelled(Table("Trials by status", "Counts of trials (seeds and retries included "
                           "once: a retried trial counts by its last attempt).",
                           counts.astype(str)), "Method", "Setting")


def unfinished(sweep: Sweep) -> Table | None:
    """Trials that did not end ``ok``, with the last line of their error."""
    bad = sweep.trials[sweep.trials["status"] != "ok"]
    if bad.empty:
        return None
    errors = bad["error"].fillna("").astype(str).map(
        lambda text: next((line.strip() for line in reversed(text.splitlines()) if line.strip()),
                          "")[:160])
    rounds = bad["diverged_round"] if "diverged_round" in bad else pd.Series(index=bad.index)
    cells = pd.DataFrame({
        "Trial": bad["trial_id"], "Method": bad["config"], "Setting": bad["setting"],
        "Seed": bad["seed"].astype(str), "Status": bad["status"],
        "Round": [("-" if pd.isna(r) else str(int(r))) for r in rounds], "Error": errors,
    }).reset_index(drop=True)
    return Table("Failed, diverged and timed-out trials",
                 "Never averaged into any table above.", cells)
