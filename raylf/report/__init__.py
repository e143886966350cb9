"""Paper-style tables and figures from any sweep directory, local or in object storage.

``python -m raylf.report SWEEP_DIR [--out DIR] [--format md|html|latex]``. The sections follow
the seeds' result tables (HDC-FL's mean ± std per setting with average ranks and its tail
table, SP-CACW's maximum over rounds, FMT-SVM's per-task, communication and privacy tables);
each appears when the sweep's tables hold its columns. First, the papers' claims that the
sweep can decide (``raylf.report.scorecard``); then what would make a number misleading: a
banner when a setting ran on stand-in data, and the degenerate results (``raylf.guards``);
after accuracy, the paired statistics and ranks across settings
(``raylf.stats``).
"""

from __future__ import annotations

from pathlib import Path

from raylf import guards, results
from raylf.report import figures, scorecard, tables
from raylf.report.data import Sweep, load
from raylf.report.render import FORMATS, RENDERERS, Report, Section

__all__ = ["FORMATS", "Report", "Sweep", "build", "load", "write_report"]


def _summary(sweep: Sweep) -> str:
    counts = sweep.trials["status"].value_counts()
    status = ", ".join(f"{n} {s}" for s, n in counts.items())
    return (f"{sweep.root}: {len(sweep.trials)} trials ({status}); "
            f"{sweep.trials['config'].nunique()} method configurations, "
            f"{len(sweep.settings)} setting(s), seeds "
            f"{sorted(int(s) for s in sweep.trials['seed'].unique())}. "
            "Every mean and rank is over trials with status ok only.")


def build(sweep: Sweep) -> Report:
    plots = {plot.name: plot for plot in figures.all_figures(sweep)}

    def section(title: str, made_tables, plot_names=(), text: str = "") -> Section:
        return Section(title, [t for t in made_tables if t is not None],
                       [plots[n] for n in plot_names if n in plots], text)

    paired = tables.paired_statistics(sweep)
    sections = [
        section("Claims", [scorecard.claims_overview(sweep)]),
        section("Checks", [tables.checks(sweep)]),
        section("Accuracy", [tables.main_table(sweep), tables.leaderboard(sweep)],
                ["learning_curves", "client_distributions"]),
        section("Paired statistics and ranks across settings", [paired],
                ["critical_difference"], tables.rank_summary(sweep) if paired else ""),
        section("Client-level tail", tables.tail_tables(sweep)),
        section("Maximum over rounds", [tables.max_over_rounds(sweep)]),
        section("Tasks", [tables.per_task(sweep)]),
        section("Differential privacy", [tables.privacy(sweep)], ["accuracy_vs_epsilon"]),
        section("Collaboration weights", [tables.alpha_table(sweep)], ["alpha_support"]),
        section("Grouping diagnostics", [], ["grouping_diagnostics"]),
        section("Communication", [tables.communication(sweep)], ["bytes_per_round"]),
        section("Failed, diverged and timed-out trials",
                [tables.statuses(sweep), tables.unfinished(sweep)]
                if (sweep.trials["status"] != "ok").any() else []),
    ]
    return Report(f"raylf report: {Path(str(sweep.root)).name}", _summary(sweep),
                  [s for s in sections if s.tables or s.plots], _banner(sweep))


def _banner(sweep: Sweep) -> list[str]:
    """What the reader must see before any number."""
    banner = [guards.standin_banner(sweep.standin)] if sweep.standin else []
    flagged = len(sweep.flags())
    if flagged:
        banner.append(f"{flagged} degenerate result(s) flagged: see Checks (marked "
                      f"{tables.FLAGGED} in the tables).")
    return banner


def write_report(root: str, out: str | None = None,
                 formats: tuple[str, ...] = ("md",)) -> dict[str, str]:
    """Render ``root``'s tables into ``out`` (default ``<root>/report``, local or a URI) as
    ``report.md`` / ``report.html`` / ``report.tex`` with ``figures/*.png``; returns the paths
    by format, plus ``figures``."""
    report = build(load(root))
    out = out or f"{str(root).rstrip('/')}/report"
    fs, base = results.filesystem(out)
    fs.create_dir(f"{base}/figures", recursive=True)
    for section in report.sections:
        for plot in section.plots:
            with fs.open_output_stream(f"{base}/figures/{plot.name}.png") as stream:
                stream.write(plot.png)
    written = {"figures": f"{out.rstrip('/')}/figures"}
    for fmt in formats:
        with fs.open_output_stream(f"{base}/{FORMATS[fmt]}") as stream:
            stream.write(RENDERERS[fmt](report).encode())
        written[fmt] = f"{out.rstrip('/')}/{FORMATS[fmt]}"
    return written
