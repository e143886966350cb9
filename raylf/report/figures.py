"""The report's figures as PNG bytes (matplotlib's object API: no pyplot state, no display).

Each function returns None when the sweep lacks the columns it draws, like the tables.
Curves are means over ``ok`` seeds with a band of one sample standard deviation.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass

import pandas as pd
from matplotlib.figure import Figure

from raylf.report.data import Sweep
from raylf.report.tables import alpha_support
from raylf.stats import ALPHA, rank_test

DIAGNOSTIC = re.compile(r"^(silhouette.*|ari_.+|.*entropy.*|.*gain.*)$")
DPI = 80


@dataclass
class Plot:
    name: str
    caption: str
    png: bytes


def _grid(count: int, width: float = 4.2, height: float = 3.0) -> tuple[Figure, list]:
    columns = min(count, 3)
    rows = math.ceil(count / columns)
    fig = Figure(figsize=(width * columns, height * rows), dpi=DPI)
    axes = fig.subplots(rows, columns, squeeze=False).ravel().tolist()
    for ax in axes[count:]:
        ax.set_visible(False)
    return fig, axes[:count]


def _png(fig: Figure) -> bytes:
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _band(ax, frame: pd.DataFrame, value: str, label: str, scale: float = 1.0) -> None:
    """Mean over seeds per round with a ±1 sample-std band (no band for one seed)."""
    stats = frame.groupby("round")[value].agg(["mean", "std"]) * scale
    line, = ax.plot(stats.index, stats["mean"], marker="o", markersize=3, label=label)
    ax.fill_between(stats.index, stats["mean"] - stats["std"].fillna(0),
                    stats["mean"] + stats["std"].fillna(0), color=line.get_color(), alpha=0.2)


def _ok_rounds(sweep: Sweep) -> pd.DataFrame:
    rounds = sweep.rounds
    return rounds[rounds["status"] == "ok"] if not rounds.empty else rounds


def learning_curves(sweep: Sweep) -> Plot | None:
    rounds = _ok_rounds(sweep)
    if rounds.empty or rounds["score"].notna().sum() == 0:
        return None
    evaluated = rounds.dropna(subset=["score"])
    settings = [s for s in sweep.settings if s in set(evaluated["setting"])]
    fig, axes = _grid(len(settings), width=5.5 if len(settings) == 1 else 4.2)
    for ax, setting in zip(axes, settings):
        for config, frame in evaluated[evaluated["setting"] == setting].groupby("config"):
            _band(ax, frame, "score", config, scale=100)
        ax.set(title=setting, xlabel="round", ylabel="mean client test accuracy (%)")
        ax.legend(fontsize=7)
    return Plot("learning_curves", "Mean client test accuracy over rounds per method: mean over "
                "seeds, band ±1 sample std.", _png(fig))


def _last_round_clients(sweep: Sweep) -> pd.DataFrame:
    """Test-split rows of the reported deployable after each ok trial's last evaluation, one
    accuracy per client (the mean over tasks for multi-task trials)."""
    clients = sweep.reported_clients
    if clients.empty:
        return clients
    last = clients[clients["round"] == clients.groupby("trial_id")["round"].transform("max")]
    return (last.groupby(["trial_id", "config", "setting", "client_id"])["accuracy"].mean()
            .reset_index())


def client_distributions(sweep: Sweep) -> Plot | None:
    last = _last_round_clients(sweep)
    if last.empty:
        return None
    settings = [s for s in sweep.settings if s in set(last["setting"])]
    fig, axes = _grid(len(settings), width=max(4.2, 1.1 * last["config"].nunique()))
    for ax, setting in zip(axes, settings):
        here = last[last["setting"] == setting]
        configs = sorted(here["config"].unique())
        ax.boxplot([100 * here.loc[here["config"] == c, "accuracy"] for c in configs],
                   tick_labels=configs)
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
        ax.set(title=setting, ylabel="client test accuracy (%)")
    return Plot("client_distributions", "Per-client test accuracy after the last round, all "
                "clients of all seeds pooled per method (box: quartiles; whiskers 1.5 IQR).",
                _png(fig))


def diagnostic_columns(rounds: pd.DataFrame) -> list[str]:
    return [c for c in rounds if DIAGNOSTIC.match(c) and not c.startswith("val_")
            and pd.api.types.is_numeric_dtype(rounds[c]) and rounds[c].notna().any()]


def grouping_diagnostics(sweep: Sweep) -> Plot | None:
    rounds = _ok_rounds(sweep)
    columns = diagnostic_columns(rounds) if not rounds.empty else []
    if not columns:
        return None
    fig, axes = _grid(len(columns))
    for ax, column in zip(axes, columns):
        present = rounds.dropna(subset=[column])
        for config, frame in present.groupby("config"):
            _band(ax, frame, column, config)
        ax.set(title=column, xlabel="round")
        ax.legend(fontsize=7)
    return Plot("grouping_diagnostics", "Grouping diagnostics over rounds (" +
                ", ".join(columns) + "): mean over seeds, band ±1 sample std.", _png(fig))


def bytes_per_round(sweep: Sweep) -> Plot | None:
    rounds = _ok_rounds(sweep)
    if rounds.empty or "bytes_up" not in rounds:
        return None
    per_client = rounds.assign(
        up=rounds["bytes_up"] / rounds["participants"].where(rounds["participants"] > 0) / 1e3,
        down=rounds["bytes_down"] / rounds["participants"].where(rounds["participants"] > 0)
        / 1e3)
    fig, axes = _grid(2)
    for ax, column, title in zip(axes, ("up", "down"), ("upload", "download")):
        for config, frame in per_client.dropna(subset=[column]).groupby("config"):
            _band(ax, frame, column, config)
        ax.set(title=f"{title} per participating client", xlabel="round", ylabel="KB")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    return Plot("bytes_per_round", "Bytes per participating client per round (KB); "
                "round 0 is a method's setup phase.", _png(fig))


def accuracy_vs_epsilon(sweep: Sweep) -> Plot | None:
    rounds = _ok_rounds(sweep)
    if rounds.empty or "dp_epsilon_composed" not in rounds:
        return None
    last = rounds.sort_values("round").groupby("trial_id").last()
    private = last.dropna(subset=["dp_epsilon_composed"])
    if private.empty:
        return None
    metrics = {"mean over tasks": "score", **{t: f"acc_mean_{t}" for t in sweep.tasks
                                              if f"acc_mean_{t}" in last}}
    fig, axes = _grid(1, width=5.0, height=3.4)
    ax = axes[0]
    for label, column in metrics.items():
        stats = private.groupby("dp_epsilon_composed")[column].agg(["mean", "std"]) * 100
        line, = ax.plot(stats.index, stats["mean"], marker="o", label=label)
        ax.errorbar(stats.index, stats["mean"], yerr=stats["std"].fillna(0), fmt="none",
                    color=line.get_color(), capsize=3)
        baseline = last.loc[last["dp_epsilon_composed"].isna(), column]
        if baseline.notna().any():
            ax.axhline(100 * baseline.mean(), color=line.get_color(), linestyle="--",
                       linewidth=1)
    ax.set(xlabel="ε composed over all rounds", ylabel="final test accuracy (%)",
           title="accuracy against ε (dashed: no DP)")
    ax.legend(fontsize=7)
    return Plot("accuracy_vs_epsilon", "Final test accuracy against the composed ε of the whole "
                "run; dashed lines: the same configuration without DP.", _png(fig))


def alpha_support_over_rounds(sweep: Sweep) -> Plot | None:
    support = alpha_support(sweep)
    if support is None or support.empty:
        return None
    fig, axes = _grid(1, width=5.0, height=3.4)
    for config, frame in support.groupby("config"):
        _band(axes[0], frame, "support", config)
    axes[0].set(xlabel="round", ylabel="peers with α > 0", title="α support per target")
    axes[0].legend(fontsize=7)
    return Plot("alpha_support", "SP-CACW: peers with non-zero weight per target over rounds "
                "(mean over targets and seeds, band ±1 std).", _png(fig))


def critical_difference(sweep: Sweep) -> Plot | None:
    """Demšar's critical-difference diagram: average ranks over the settings the
    configurations share on an axis (best left), a bar joining every run of configurations
    closer than Nemenyi's critical difference (not shown to differ)."""
    means = sweep.ok.groupby(["config", "setting"], sort=False)["score"].mean().unstack("setting")
    test = rank_test(means)
    if test is None:
        return None
    names, ranks = list(test.ranks.index), test.ranks.to_numpy()
    k = len(names)
    span = (k - 1) / 0.4  # the axis takes the middle 40 % of the width, labels the sides
    low, high = 1 - 0.3 * span, k + 0.3 * span
    half = math.ceil(k / 2)
    fig = Figure(figsize=(9.0, 1.6 + 0.3 * half), dpi=DPI)
    ax = fig.subplots()
    ax.set_axis_off()
    ax.set_xlim(low, high)
    ax.set_ylim(-(half + 1) * 0.3, 0.6)
    ax.plot([1, k], [0, 0], color="black", linewidth=1)
    for tick in range(1, k + 1):
        ax.plot([tick, tick], [0, 0.06], color="black", linewidth=1)
        ax.text(tick, 0.1, str(tick), ha="center", va="bottom", fontsize=8)
    ax.plot([1, 1 + test.cd], [0.45, 0.45], color="black", linewidth=1.5)
    ax.text(1 + test.cd / 2, 0.5, f"CD = {test.cd:.2f}", ha="center", va="bottom", fontsize=8)
    for i, (name, rank) in enumerate(zip(names, ranks)):
        left = i < half
        y = -0.3 * ((i if left else k - 1 - i) + 1)
        end = 1 - 0.05 * span if left else k + 0.05 * span
        ax.plot([rank, rank, end], [0, y, y], color="black", linewidth=0.8)
        ax.text(end + (-0.02 if left else 0.02) * span, y, f"{name} ({rank:.2f})",
                ha="right" if left else "left", va="center", fontsize=8)
    runs: list[tuple[int, int]] = []
    for i in range(k):
        j = max(j for j in range(i, k) if ranks[j] - ranks[i] < test.cd)
        if j > i and not any(a <= i and j <= b for a, b in runs):
            runs.append((i, j))
    for level, (i, j) in enumerate(runs):
        y = -0.08 - 0.06 * level
        ax.plot([ranks[i] - 0.03, ranks[j] + 0.03], [y, y], color="black", linewidth=3)
    ax.set_title(f"average rank over {len(test.settings)} settings; Friedman χ² = "
                 f"{test.statistic:.2f}, p = {test.p:.2g}", fontsize=9)
    return Plot("critical_difference", "Critical-difference diagram: average rank of the final "
                f"mean client accuracy over the {len(test.settings)} settings the "
                f"{k} configurations share (1 = best); a bar joins configurations closer than "
                f"Nemenyi's critical difference at α = {ALPHA}.", _png(fig))


FIGURES = (learning_curves, client_distributions, grouping_diagnostics, bytes_per_round,
           accuracy_vs_epsilon, alpha_support_over_rounds, critical_difference)


def all_figures(sweep: Sweep) -> list[Plot]:
    return [plot for make in FIGURES if (plot := make(sweep)) is not None]
