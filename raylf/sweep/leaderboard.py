"""Per setting, method and grid point: mean ± sample std over seeds of the headline metrics,
and for a point a search chose, the validation score it was chosen by. Rows are ranked within
their setting only (dataset · scenario · model and any setting field the sweep varies, as the
report labels it): methods on different data are never ranked against each other, and a method
alone in its setting is not ranked at all.

Each row is compared, paired by seed and client (``raylf.stats``), with the best of its setting
and with the paper's method there (hdcfl, spcacw or fmtsvm); rows the paired test cannot tell
from the best are marked tied. Degenerate results (``raylf.guards``: identical to another row,
a method's collapse diagnostics) are flagged, and settings that ran on stand-in data are marked
in their label and announced above the tables."""

from __future__ import annotations

import pandas as pd

from raylf import guards, metrics, results, stats
from raylf.labels import (
    METHOD_FIELDS,
    SETTING_FIELDS,
    methods_with,
    point_label,
    setting_labels,
)
from raylf.results import STATUSES

METRICS = ("acc_mean", "acc_worst", "acc_bottom20", "acc_gap")
CHOICE_COLUMNS = {"chosen_by": "objective", "val_score": "score", "search_rank": "rank",
                  "search_points": "points", "search_trials": "budget"}


def leaderboard(root: str, trials, choices: dict | None = None) -> pd.DataFrame:
    """One row per (setting, method, grid point), settings in order of appearance, best
    acc_mean first within each; only this sweep's trials.
    ``choices`` (trial id → :class:`raylf.sweep.search.Choice`) adds how each searched point was
    chosen: ``chosen_by`` (the objective), ``val_score`` (its mean over the search seeds),
    ``search_rank``, ``search_points`` and ``search_trials`` (the budget spent).
    Every row also carries ``entry`` (method and grid point), ``standin`` (its setting ran on
    stand-in data), ``flags`` (degenerate-result flags, "" when none) and the paired comparison
    of :func:`raylf.stats.versus` (``best``, ``tied``, ``best_delta`` …, ``paper`` …)."""
    tables = results.load(root)
    table = tables["trials"]
    wanted = {t.trial_id: t for t in trials}
    table = table[table["trial_id"].isin(wanted)].copy()
    if table.empty:
        return pd.DataFrame()
    table["point"] = [_point({**own, **wanted[t].point})
                      for t, own in zip(table["trial_id"], _own_parameters(table))]
    table["setting"] = guards.mark_standin(table, setting_labels(table))
    table["entry"] = [entry_label(m, p) for m, p in zip(table["method"], table["point"])]
    chosen = [(choices or {}).get(t) for t in table["trial_id"]]
    for column, field in CHOICE_COLUMNS.items():
        if any(chosen):
            table[column] = [getattr(c, field) if c else None for c in chosen]
    metrics = [c for m in METRICS for c in table.columns
               if (c == m or c.startswith(m + "_")) and table[c].notna().any()]
    grouped = table.groupby(["setting", "method", "point"], sort=False)
    board = grouped[metrics].agg(["mean", "std"]) if metrics else \
        pd.DataFrame(index=grouped.size().index)  # every trial failed: statuses only
    board.columns = [f"{m}_{stat}" for m, stat in board.columns]
    board["seeds"] = grouped.size()
    for column in CHOICE_COLUMNS:
        if column in table:
            board[column] = grouped[column].first()
    for status in STATUSES:
        board[status] = grouped["status"].apply(lambda s, status=status: int((s == status).sum()))
    board = board.reset_index()
    board["entry"] = [entry_label(m, p) for m, p in zip(board["method"], board["point"])]
    board["standin"] = board["setting"].str.endswith(guards.STANDIN_MARK)
    order = {s: i for i, s in enumerate(board["setting"].unique())}
    board = board.assign(_setting=board["setting"].map(order), _rank=float("nan"))
    table["_score"] = float("nan")
    for setting in order:
        rows, runs = board["setting"] == setting, table["setting"] == setting
        ranking = _ranking_columns(board.loc[rows])
        if ranking:
            board.loc[rows, "_rank"] = board.loc[rows, ranking].mean(axis=1)
            trial_columns = [c.removesuffix("_mean") for c in ranking]
            table.loc[runs, "_score"] = table.loc[runs, trial_columns].mean(axis=1)
    board = board.join(_judged(board, table, tables), on=["setting", "entry"])
    board["flags"] = board["flags"].fillna("")
    board = board.sort_values(["_setting", "_rank"], ascending=[True, False],
                              na_position="last").drop(columns=["_setting", "_rank"])
    return _none_for_missing(board.reset_index(drop=True))


def _judged(board: pd.DataFrame, table: pd.DataFrame,
            tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per (setting, entry): the paired comparison with the best and the paper's method, on
    the ranking figure per client where the clients table has it, and the flags."""
    ok = table[table["status"] == "ok"]
    clients = tables["clients"]
    if "trial_id" in clients:
        clients = clients[clients["trial_id"].isin(set(ok["trial_id"]))]
    values = stats.paired_values(ok.dropna(subset=["_score"]), "_score",
                                 stats.client_accuracy(stats.reported_rows(clients, ok)))
    judged = stats.versus(values, board.set_index(["setting", "entry"])["_rank"],
                          reproduced=tuple(methods_with(ok, "proposed_in")))
    judged["flags"] = guards.flags(ok, values, tables["rounds"], tables.get("alpha"))
    return judged


def _none_for_missing(board: pd.DataFrame) -> pd.DataFrame:
    """Text columns with None, not nan, where empty: the sweep writes the board as a table, and
    Arrow reads a nan among strings as a number."""
    for column in board.columns:
        if not pd.api.types.is_numeric_dtype(board[column]):
            board[column] = board[column].astype(object).where(board[column].notna(), None)
    return board


def _ranking_columns(board: pd.DataFrame) -> list[str]:
    """What ranks a setting: acc_mean (single task), else each task's acc_mean_<task> (their
    mean) — of the reported model only: a column that extends another by a suffix is a second
    deployable's (``acc_mean_shared``, ``acc_mean_binary_own_heads``) and does not rank."""
    present = [c[: -len("_mean")] for c in board
               if c.startswith("acc_mean") and c.endswith("_mean") and board[c].notna().any()]
    return [f"{c}_mean" for c in metrics.of_reported_model(present)]


def _own_parameters(table: pd.DataFrame) -> list[dict]:
    """Per trial, the method parameters that differ between the trials of its method outside
    any grid (a method the sweep lists twice, e.g. Per-FedAvg's two variants): they name its
    row as a grid point does, so two entries never share one row."""
    columns = [c for c in table if c.startswith(METHOD_FIELDS)]
    own: dict[int, dict] = {i: {} for i in table.index}
    for _, group in table.groupby("method", sort=False):
        varied = [c for c in columns if group[c].notna().any()
                  and group[c].map(str).nunique() > 1]
        for i, row in group[varied].iterrows():
            own[i] = {c: v for c, v in row.items() if pd.notna(v)}
    return [own[i] for i in table.index]


def _point(point: dict) -> str:
    """The grid point without a whole section of the setting (``scenario: {name: dirichlet,
    alpha: 0.1}``, a grid over splits): the setting's label names it, and the row sits under
    that setting."""
    return point_label({k: v for k, v in point.items()
                        if not (isinstance(v, dict) and f"{k}." in SETTING_FIELDS)}) or "-"


def entry_label(method: str, point: str) -> str:
    """How a flag or a comparison names a row: ``fedprox [mu=0.1]``, or the method alone."""
    return method if point == "-" else f"{method} [{point}]"


def render(board: pd.DataFrame) -> str:
    if board.empty:
        return "leaderboard: no finished trials"
    searched = "chosen_by" in board
    settings = list(board["setting"].unique())
    parts = [_render_setting(board[board["setting"] == s].drop(columns="setting"), searched,
                             f"setting: {s}" if len(settings) > 1 else None) for s in settings]
    title = "leaderboard (test data: mean ± sample std over seeds; final round"
    title += "; searched points chosen on validation data)" if searched else ")"
    title += ", ranked within each setting" if len(settings) > 1 else ""
    title += (f"; vs best / vs the paper's method: mean paired difference over seeds × clients "
              f"[95 % bootstrap CI], Wilcoxon p, pairs; tied: p ≥ {stats.ALPHA}; a method alone "
              "in its setting is not ranked:")
    standin = [s for s in settings if s.endswith(guards.STANDIN_MARK)]
    banner = [guards.standin_banner(standin)] if standin else []
    return "\n".join([*banner, title]) + "\n" + "\n\n".join(parts)


def _render_setting(board: pd.DataFrame, searched: bool, heading: str | None) -> str:
    metrics = [c[: -len("_mean")] for c in board.columns
               if c.endswith("_mean") and c.startswith(METRICS) and board[c].notna().any()]
    paper = next(iter(board["paper"].dropna()), None)
    header = ["rank", "method", "grid point", *(["chosen on validation"] if searched else []),
              *metrics, "seeds", "ok/div/fail/timeout", "vs best",
              *([f"vs {paper}"] if paper else [])]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    flagged = []
    for rank, row in enumerate(board.itertuples(index=False), 1):
        ranked = pd.notna(row.best)
        cells = [str(rank) if ranked else "-", row.method, row.point]
        if searched:
            cells.append("- (not searched)" if pd.isna(row.chosen_by) else (
                f"{row.chosen_by} {row.val_score:.4f} (#{int(row.search_rank)} of "
                f"{int(row.search_points)} points, {int(row.search_trials)} trials)"))
        for m in metrics:
            mean, std = getattr(row, f"{m}_mean"), getattr(row, f"{m}_std")
            cells.append("-" if pd.isna(mean) else
                         f"{mean:.4f}" + ("" if pd.isna(std) else f" ± {std:.4f}"))
        cells += [str(row.seeds), "/".join(str(getattr(row, s)) for s in STATUSES)]
        cells.append(_versus(row, "best", row.best) if ranked else
                     "- (alone in its setting)" if len(board) == 1 else "-")
        if paper:
            cells.append(_versus(row, "paper", row.paper))
        lines.append("| " + " | ".join(cells) + " |")
        if row.flags:
            flagged.append(f"  ! {row.entry}: {row.flags}")
    flags = ["degenerate results:", *flagged] if flagged else []
    return "\n".join(([heading] if heading else []) + lines + flags)


def _versus(row, name: str, other: str | None) -> str:
    if other == row.entry:
        return name
    pairs = getattr(row, f"{name}_pairs")
    if pd.isna(other) or pd.isna(pairs):
        return "-"
    delta, low, high, p = (getattr(row, f"{name}_{f}") for f in ("delta", "low", "high", "p"))
    interval = "" if pd.isna(low) else f" [{low:+.4f}, {high:+.4f}]"
    tied = "tied: " if name == "best" and row.tied else ""
    return f"{tied}{delta:+.4f}{interval} p {p:.2g} ({int(pairs)} pairs)"
