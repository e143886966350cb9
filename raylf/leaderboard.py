"""Per method and grid point: mean ± sample std over seeds of the headline metrics."""

from __future__ import annotations

import pandas as pd

from raylf import results

METRICS = ("acc_mean", "acc_worst", "acc_bottom20", "acc_gap")
STATUSES = ("ok", "diverged", "failed", "timeout")


def leaderboard(root: str, trials) -> pd.DataFrame:
    """One row per (method, grid point), best acc_mean first; only this sweep's trials."""
    table = results.load(root)["trials"]
    wanted = {t.trial_id: t for t in trials}
    table = table[table["trial_id"].isin(wanted)].copy()
    if table.empty:
        return pd.DataFrame()
    table["point"] = [_point(wanted[t].point) for t in table["trial_id"]]
    metrics = [c for m in METRICS for c in table.columns
               if (c == m or c.startswith(m + "_")) and table[c].notna().any()]
    grouped = table.groupby(["method", "point"], sort=False)
    board = grouped[metrics].agg(["mean", "std"])
    board.columns = [f"{m}_{stat}" for m, stat in board.columns]
    board["seeds"] = grouped.size()
    for status in STATUSES:
        board[status] = grouped["status"].apply(lambda s, status=status: int((s == status).sum()))
    board = board.reset_index()
    ranking = [c for c in board if c.startswith("acc_mean") and c.endswith("_mean")]
    if ranking:  # single-task: acc_mean; multi-task: the mean over the tasks' acc_mean
        board = board.assign(_rank=board[ranking].mean(axis=1)).sort_values(
            "_rank", ascending=False, na_position="last").drop(columns="_rank")
    return board.reset_index(drop=True)


def _point(point: dict) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in point.items()) or "-"


def render(board: pd.DataFrame) -> str:
    if board.empty:
        return "leaderboard: no finished trials"
    metrics = [c[: -len("_mean")] for c in board.columns
               if c.endswith("_mean") and c.startswith(METRICS)]
    header = ["rank", "method", "grid point", *metrics, "seeds", "ok/div/fail/timeout"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for rank, row in enumerate(board.itertuples(index=False), 1):
        cells = [str(rank), row.method, row.point]
        for m in metrics:
            mean, std = getattr(row, f"{m}_mean"), getattr(row, f"{m}_std")
            cells.append("-" if pd.isna(mean) else
                         f"{mean:.4f}" + ("" if pd.isna(std) else f" ± {std:.4f}"))
        cells += [str(row.seeds), "/".join(str(getattr(row, s)) for s in STATUSES)]
        lines.append("| " + " | ".join(cells) + " |")
    return "leaderboard (mean ± sample std over seeds; final round):\n" + "\n".join(lines)
