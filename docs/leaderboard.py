"""The PFL leaderboard, docs/leaderboard.md, written from a finished run of
tune/pfl_methods.yaml: per split, every method's final mean client test accuracy over seeds,
and each method against local training and against FedAvg paired by seed and client (the mean
difference with its 95 % bootstrap interval and Wilcoxon's two-sided p, ``raylf.stats.paired``),
read as *beats*, *ties* or *behind*; the degenerate-result guard's flags (``raylf.guards``); and
the command, date, commit and machine that measured it.

    python -m raylf.sweep tune/pfl_methods.yaml --storage DIR
    python docs/leaderboard.py DIR/pfl_methods --command "..." --machine "..."

Unlike docs/methods.md this page is a measurement, not a view of the code: it is written once
per run and committed with what it says ran. tests/test_docs.py checks that it lists every
method entry of tune/pfl_methods.yaml on each split, so a method added to the sweep without a
new run shows.
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from raylf.stats import Paired  # noqa: E402

PAGE = Path(__file__).parent / "leaderboard.md"
REFERENCES = ("local", "fedavg")  # what every PFL method is read against


@dataclass(frozen=True)
class Versus:
    """A method against a reference over the (seed, client) pairs: the mean difference and its
    interval (``raylf.stats.paired``) and Wilcoxon's one-sided p each way
    (``raylf.stats.one_sided``), which decide as the claims do (docs/claims.md)."""

    paired: Paired
    greater: float
    less: float


def versus(a: pd.Series, b: pd.Series) -> Versus | None:
    from raylf.stats import differences, one_sided, paired

    result = paired(a, b)
    if result is None:
        return None
    d = differences(a, b)
    return Versus(result, one_sided(d, 0.0, "greater").p, one_sided(d, 0.0, "less").p)


def verdict(result: Versus | None) -> str:
    """*beats* / *behind* where the one-sided test that way, read two-sided (twice its p), is
    below ``raylf.stats.ALPHA``, else *ties*; '-' against itself. The test's direction, not the
    mean's sign, decides: a few clients far behind can pull the mean below zero while most
    clients gain (then the Δ column shows the mean's sign and the verdict the ranks')."""
    from raylf.stats import ALPHA

    if result is None:
        return "-"
    if 2 * result.greater < ALPHA:
        return "beats"
    if 2 * result.less < ALPHA:
        return "behind"
    return "ties"


def cell(result: Versus | None) -> str:
    if result is None:
        return "-"
    delta = result.paired
    interval = "" if math.isnan(delta.low) else \
        f" [{100 * delta.low:+.1f}, {100 * delta.high:+.1f}]"
    p = min(1.0, 2 * min(result.greater, result.less))
    return f"{verdict(result)} {100 * delta.delta:+.1f}{interval}, p {p:.2g}"


def rows(sweep) -> pd.DataFrame:
    """One row per (setting, configuration): mean ± sample std over seeds, the paired result
    against each reference (None where it is the reference or the reference did not run), and
    the guard's flags."""
    from raylf.stats import entry_series

    values = sweep.paired_values("score")
    flags = sweep.flags()
    found = []
    for setting, here in sweep.ok.groupby("setting", sort=False):
        mine = values[values["setting"] == setting]
        series = entry_series(mine)
        method_of = here.groupby("config")["method"].first()
        reference = {name: next((c for c, m in method_of.items() if m == name), None)
                     for name in REFERENCES}
        scores = here.groupby("config", sort=False)["score"]
        for config, mean in scores.mean().sort_values(ascending=False).items():
            row = {"setting": setting, "config": config, "mean": mean,
                   "std": scores.std().get(config, math.nan),
                   "seeds": int(scores.count()[config]),
                   "flags": flags.get((setting, config), "")}
            for name, other in reference.items():
                row[name] = None if other in (None, config) or config not in series \
                    else versus(series[config], series[other])
            found.append(row)
    return pd.DataFrame(found)


def render(sweep, command: str, machine: str, when: str, commit: str) -> str:
    table = rows(sweep)
    stand_in = ", ".join(sweep.standin)
    lines = [
        "# PFL leaderboard",
        "",
        "<!-- written by `python docs/leaderboard.py` from a run of tune/pfl_methods.yaml -->",
        "",
        "Every personalized-FL method of raylf that trains in rounds on one task, at its "
        "defaults, on scikit-learn's bundled 8×8 digits (real data, 1,797 images; small: "
        "read these as a check that each method works and where it stands on an easy task, "
        "not as a ranking for CIFAR-scale data) under two label skews, 3 seeds each. The "
        "settings, and why the per-step family, the oracles and the multi-task methods are "
        "not in it, are in `tune/pfl_methods.yaml`.",
        "",
        f"Measured {when} at commit `{commit}` on {machine}:",
        "",
        "```bash",
        command,
        "```",
        "",
        "Final-round mean client test accuracy (%), mean ± sample std over seeds. *vs local* and "
        "*vs fedavg*: the method minus the reference in points, paired by seed and client (the "
        "same partition), with a 95 % percentile bootstrap interval, and Wilcoxon's signed-rank "
        "test each way read two-sided (p: twice the smaller one-sided p); *beats* / *behind* "
        "where it is below 0.05, by the test's direction, else *ties* (the rule of the claims, "
        "docs/claims.md; the direction is the ranks', so a mean below zero can beat when most "
        "clients gain and a few lose much). Uncorrected for the many comparisons, and pairs that "
        "share a seed share the federation, so the p values are optimistic: read a lone *beats* "
        "near 0.05 as a hint. *Flags*: the degenerate-result guard (a method whose every client's"
        " accuracy equals another's, or a collapsed diagnostic); empty is none.",
    ]
    if stand_in:
        lines += ["", f"**STAND-IN DATA** in {stand_in}: these figures are not results."]
    for setting, here in table.groupby("setting", sort=False):
        lines += ["", f"## {setting}", "",
                  "| method | accuracy | vs local | vs fedavg | seeds | flags |",
                  "|---|---|---|---|---|---|"]
        for row in here.itertuples():
            lines.append(
                f"| {row.config} | {100 * row.mean:.1f} ± {100 * row.std:.1f} | "
                f"{cell(row.local)} | {cell(row.fedavg)} | {row.seeds} | {row.flags} |")
    failed = sweep.trials[sweep.trials["status"] != "ok"]
    lines += ["", "## Trials that did not end ok", ""]
    lines += [f"- {r.trial_id}: {r.status}" for r in failed.itertuples()] or ["None."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir")
    parser.add_argument("--command", required=True, help="the command that ran the sweep")
    parser.add_argument("--machine", required=True, help="what it ran on, in words")
    parser.add_argument("--commit", required=True)
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    args = parser.parse_args(argv)
    from raylf.report.data import load

    PAGE.write_text(render(load(args.sweep_dir), args.command, args.machine, args.date,
                           args.commit))
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
