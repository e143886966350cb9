"""Per setting, method and grid point: mean ± sample std over seeds of the headline metrics,
and for a point a search chose, the validation score it was chosen by. Rows are ranked within
their setting (dataset · scenario · model) only: methods on different data are never ranked
against each other."""

from __future__ import annotations

import pandas as pd

from raylf import results
from raylf.sweepspec import point_label

METRICS = ("acc_mean", "acc_worst", "acc_bottom20", "acc_gap")
STATUSES = ("ok", "diverged", "failed", "timeout")
SETTING = ("dataset", "scenario", "model")
CHOICE_COLUMNS = {"chosen_by": "objective", "val_score": "score", "search_rank": "rank",
                  "search_points": "points", "search_trials": "budget"}


def leaderboard(root: str, trials, choices: dict | None = None) -> pd.DataFrame:
    """One row per (setting, method, grid point), settings in order of appearance, best
    acc_mean first within each; only this sweep's trials.
    ``choices`` (trial id → :class:`raylf.search.Choice`) adds how each searched point was
    chosen: ``chosen_by`` (the objective), ``val_score`` (its mean over the search seeds),
    ``search_rank``, ``search_points`` and ``search_trials`` (the budget spent)."""
    table = results.load(root)["trials"]
    wanted = {t.trial_id: t for t in trials}
    table = table[table["trial_id"].isin(wanted)].copy()
    if table.empty:
        return pd.DataFrame()
    table["point"] = [_point(wanted[t].point) for t in table["trial_id"]]
    table["setting"] = table[list(SETTING)].astype(str).agg(" · ".join, axis=1)
    chosen = [(choices or {}).get(t) for t in table["trial_id"]]
    for column, field in CHOICE_COLUMNS.items():
        if any(chosen):
            table[column] = [getattr(c, field) if c else None for c in chosen]
    metrics = [c for m in METRICS for c in table.columns
               if (c == m or c.startswith(m + "_")) and table[c].notna().any()]
    grouped = table.groupby(["setting", "method", "point"], sort=False)
    board = grouped[metrics].agg(["mean", "std"])
    board.columns = [f"{m}_{stat}" for m, stat in board.columns]
    board["seeds"] = grouped.size()
    for column in CHOICE_COLUMNS:
        if column in table:
            board[column] = grouped[column].first()
    for status in STATUSES:
        board[status] = grouped["status"].apply(lambda s, status=status: int((s == status).sum()))
    board = board.reset_index()
    order = {s: i for i, s in enumerate(board["setting"].unique())}
    board = board.assign(_setting=board["setting"].map(order), _rank=0.0)
    for setting in order:
        rows = board["setting"] == setting
        ranking = _ranking_columns(board.loc[rows])
        if ranking:
            board.loc[rows, "_rank"] = board.loc[rows, ranking].mean(axis=1)
    board = board.sort_values(["_setting", "_rank"], ascending=[True, False],
                              na_position="last").drop(columns=["_setting", "_rank"])
    return board.reset_index(drop=True)


def _ranking_columns(board: pd.DataFrame) -> list[str]:
    """What ranks a setting: acc_mean (single task), else each task's acc_mean_<task> (their
    mean) — of the reported model only: a column that extends another by a suffix is a second
    deployable's (``acc_mean_shared``, ``acc_mean_binary_own_heads``) and does not rank."""
    present = [c[: -len("_mean")] for c in board
               if c.startswith("acc_mean") and c.endswith("_mean") and board[c].notna().any()]
    base = [c for c in present if not any(c.startswith(o + "_") for o in present if o != c)]
    return [f"{c}_mean" for c in base]


def _point(point: dict) -> str:
    return point_label(point) or "-"


def render(board: pd.DataFrame) -> str:
    if board.empty:
        return "leaderboard: no finished trials"
    searched = "chosen_by" in board
    settings = list(board["setting"].unique())
    parts = [_render_setting(board[board["setting"] == s].drop(columns="setting"), searched,
                             f"setting: {s}" if len(settings) > 1 else None) for s in settings]
    title = "leaderboard (test data: mean ± sample std over seeds; final round"
    title += "; searched points chosen on validation data)" if searched else ")"
    title += ", ranked within each setting:" if len(settings) > 1 else ":"
    return title + "\n" + "\n\n".join(parts)


def _render_setting(board: pd.DataFrame, searched: bool, heading: str | None) -> str:
    metrics = [c[: -len("_mean")] for c in board.columns
               if c.endswith("_mean") and c.startswith(METRICS) and board[c].notna().any()]
    header = ["rank", "method", "grid point", *(["chosen on validation"] if searched else []),
              *metrics, "seeds", "ok/div/fail/timeout"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for rank, row in enumerate(board.itertuples(index=False), 1):
        cells = [str(rank), row.method, row.point]
        if searched:
            cells.append("- (not searched)" if pd.isna(row.chosen_by) else (
                f"{row.chosen_by} {row.val_score:.4f} (#{int(row.search_rank)} of "
                f"{int(row.search_points)} points, {int(row.search_trials)} trials)"))
        for m in metrics:
            mean, std = getattr(row, f"{m}_mean"), getattr(row, f"{m}_std")
            cells.append("-" if pd.isna(mean) else
                         f"{mean:.4f}" + ("" if pd.isna(std) else f" ± {std:.4f}"))
        cells += [str(row.seeds), "/".join(str(getattr(row, s)) for s in STATUSES)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(([heading] if heading else []) + lines)
