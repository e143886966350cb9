"""A paper's scorecard: its published figures and claims set against one sweep.

``python -m raylf.report SWEEP --paper hdcfl|spcacw|fmtsvm``. For every paper setting the
sweep runs the same kind of (the same shift: ``Setting.match``), the scorecard first decides
whether the two are *comparable*: the same data, model, clients and training length as the
paper (the preset's fields and the paper's own, ``raylf.report.papers``), on real data. Only
then does it put numbers side by side: the paper's figure, raylf's mean ± std over ok seeds, the
difference, and per paper table the rank agreement of the methods both ran (Kendall's τ).
Elsewhere it says why not, because a figure on other data, on stand-in data or from a shorter
run is no check of the paper. The claims (``raylf.report.claims``) are about orderings and are
decided on any real setting that holds their methods.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from scipy.stats import kendalltau

from raylf import results
from raylf.report import claims as claims_module
from raylf.report.data import Sweep, load
from raylf.report.measured import Measured, per_step
from raylf.report.papers import UNITS, Figure, Paper, Setting, same
from raylf.report.papers import load as load_paper
from raylf.report.papers import names as paper_names
from raylf.report.render import FORMATS, RENDERERS, Report, Section
from raylf.report.tables import Table
from raylf.stats import ALPHA

MIN_RANKED = 3  # Kendall's τ over fewer methods says nothing


class NothingToScore(ValueError):
    """The sweep holds no setting of the paper's tables and can decide none of its claims."""


@dataclass
class Coverage:
    """A paper setting and a sweep setting of the same kind; comparable when no ``reasons``."""

    setting: Setting
    label: str
    reasons: list[str]

    @property
    def comparable(self) -> bool:
        return not self.reasons

    @property
    def verdict(self) -> str:
        return "comparable" if self.comparable else "not comparable: " + "; ".join(self.reasons)


def _values(trials: pd.DataFrame, column: str) -> list:
    if column not in trials:
        return []
    return list(dict.fromkeys(v for v in trials[column] if v is not None and not
                              (isinstance(v, float) and math.isnan(v))))


def coverage(measured: Measured, paper: Paper) -> list[Coverage]:
    """Every (paper setting with figures, sweep setting) pair that agrees on the setting's
    ``match`` fields, with what keeps it from being comparable."""
    used = list(dict.fromkeys(f.setting for f in paper.figures))
    out = []
    for label, trials in measured.trials.groupby("setting", sort=False):
        for setting in (paper.settings[s] for s in used):
            if not all(any(same(v, setting.fields[k]) for v in _values(trials, k))
                       for k in setting.match):
                continue
            out.append(Coverage(setting, label, _reasons(trials, setting)))
    return out


def _reasons(trials: pd.DataFrame, setting: Setting) -> list[str]:
    """Why a sweep setting's numbers cannot be set against the paper's: stand-in data, any
    field the paper's protocol fixes (every resolved dataset, scenario and model parameter of
    its preset, the paper's own fields) with another value, other epochs (exactly: the papers
    report a maximum over epochs, which a longer run inflates). Each mismatch is named."""
    reasons = ["stand-in data"] if trials["standin"].any() else []
    round_based = trials[~per_step(trials)]  # a per-step round is one step
    for key, expected in setting.fields.items():
        found = _values(round_based if key == "federation.rounds" else trials, key)
        if not found and expected is None:
            continue
        if not found or not all(same(v, expected) for v in found):
            shown = ", ".join(str(v) for v in found) or "unset"
            reasons.append(f"{key} {shown} (paper: {expected})")
    if setting.epochs is not None:
        epochs = _values(trials, "epochs")
        if not epochs or not all(same(e, setting.epochs) for e in epochs):
            shown = ", ".join(f"{e:g}" for e in epochs) or "unknown"
            reasons.append(f"{shown} epochs (paper: {setting.epochs:g})")
    return reasons


def _in_unit(value: float, figure: Figure) -> float:
    return value * UNITS[figure.unit]


def _figure_text(mean: float, std: float | None, unit: str, sign: str = "") -> str:
    """A number in the paper's unit: bytes whole, percent to 2 decimals, fractions to 4."""
    if unit == "bytes":
        return f"{mean:{sign},.0f} B"
    digits = 2 if unit == "percent" else 4
    return f"{mean:{sign}.{digits}f}" + (
        "" if std is None or pd.isna(std) else f" ± {std:.{digits}f}")


def figures_table(measured: Measured, paper: Paper, table: str,
                  covered: list[Coverage]) -> Table | None:
    """The paper table's cells in comparable settings: figure, raylf, difference."""
    rows = []
    for cover in (c for c in covered if c.comparable):
        for figure in paper.figures:
            if figure.table != table or figure.setting != cover.setting.id:
                continue
            means = measured.means(figure.metric)
            if cover.label not in means.index.get_level_values("setting"):
                continue
            here = means.loc[cover.label]
            for config, found in here[here["method"] == figure.method].iterrows():
                mean, std = _in_unit(found["mean"], figure), _in_unit(found["std"], figure)
                rows.append({
                    "Paper cell": f"{figure.row} × {figure.column}", "Metric": figure.metric,
                    "Paper": figure.printed, "raylf": _figure_text(mean, std, figure.unit)
                    + f" ({int(found['count'])} seeds)",
                    "Δ raylf − paper": _figure_text(mean - figure.mean, None, figure.unit, "+"),
                    "Configuration": config, "Sweep setting": cover.label})
    if not rows:
        return None
    return Table(f"{table}: paper against raylf",
                 "Only comparable settings (see Settings). raylf: mean ± sample std over ok "
                 "seeds, in the paper's unit; Δ is raylf minus the paper.", pd.DataFrame(rows))


def rank_agreement(measured: Measured, paper: Paper, covered: list[Coverage]) -> Table | None:
    """Per paper table, comparable setting and metric: Kendall's τ between the paper's figures
    and raylf's means (each method's best configuration) over the methods both have."""
    rows = []
    for cover in (c for c in covered if c.comparable):
        groups: dict[tuple[str, str], dict[str, float]] = {}
        for f in paper.figures:
            if f.setting == cover.setting.id:
                groups.setdefault((f.table, f.metric), {})[f.method] = f.mean
        for (table, metric), published in groups.items():
            means = measured.means(metric)
            if cover.label not in means.index.get_level_values("setting"):
                continue
            per_method = means.loc[cover.label].groupby("method")["mean"]
            ours = per_method.max() if claims_module.better(metric) else per_method.min()
            shared = [m for m in published if m in ours.index]
            rows.append({"Table": table, "Metric": metric, "Paper setting": cover.setting.id,
                         "Sweep setting": cover.label, "Methods": str(len(shared)),
                         "Kendall τ": tau_text([published[m] for m in shared],
                                               [ours[m] for m in shared]),
                         "Shared methods": ", ".join(shared)})
    if not rows:
        return None
    return Table("Kendall's τ per paper table",
                 "Kendall's τ (scipy.stats.kendalltau, τ-b) between the paper's ordering and "
                 "raylf's over the methods both have in a comparable setting; n/a with fewer "
                 f"than {MIN_RANKED}.", pd.DataFrame(rows))


def tau_text(published: list[float], ours: list[float]) -> str:
    if len(published) < MIN_RANKED:
        return "n/a"
    tau = kendalltau(published, ours).statistic
    return "n/a (constant)" if pd.isna(tau) else f"{tau:.3f}"


def _reported(cover: Coverage, paper: Paper, measured: Measured) -> list[Figure]:
    """The paper setting's figures of methods the sweep setting ran."""
    ran = set(measured.trials.loc[measured.trials["setting"] == cover.label, "method"])
    return [f for f in paper.figures if f.setting == cover.setting.id and f.method in ran]


def coverage_table(covered: list[Coverage], paper: Paper, measured: Measured) -> Table:
    rows = []
    for cover in covered:
        columns = sorted({f"{f.table} {f.column}" for f in paper.figures
                          if f.setting == cover.setting.id})
        rows.append({"Paper setting": f"{cover.setting.id} ({', '.join(columns)})",
                     "Sweep setting": cover.label,
                     "Figures of methods it ran": str(len(_reported(cover, paper, measured))),
                     "Verdict": cover.verdict})
    return Table("Paper settings the sweep runs",
                 "Each paper setting the sweep runs the same kind of (the same scenario), and "
                 "whether the numbers can be compared: the paper's data, model, client count "
                 "and training length (where the paper is silent, raylf's paper-scale choice "
                 "noted in its paper file), on real data.", pd.DataFrame(rows))


CLAIM_NOTE = (
    "Inside its scope (the paper's data, model and kind of shift) a claim is the paper's; on "
    "the sweep's other real settings the same test is exploratory. Holds / does not hold: the "
    "paired Wilcoxon tests (per seed and client; per seed for a per-trial figure), Holm-"
    f"adjusted over the family, concluded at {ALPHA}, or the numbers decided as the paper "
    "decides them (highest, rank, bytes); not shown: the tests could have concluded and did "
    "not; undecidable: with this many pairs no outcome could have reached the level. Margins "
    "are part of the claim. Numbers: means over ok seeds (accuracy in %), Δ this minus that "
    "over the pairs with its 95 % bootstrap interval. Rules: raylf.report.claims.")


def _claim_rows(verdicts: list[claims_module.Verdict], paper: str | None = None) -> list[dict]:
    return [{**({"Paper": paper} if paper else {}), "Claim": v.claim.name, "Verdict": v.verdict,
             "Scope": v.scope, "Decided on": v.where, "Numbers": v.numbers,
             "Source": v.claim.source}
            for v in verdicts]


def claims_tables(verdicts: list[claims_module.Verdict]) -> list[Table]:
    """The paper's claims in their scope (every claim, decided or why not), then the
    exploratory verdicts outside it."""
    scoped = [v for v in verdicts if not v.exploratory]
    explored = [v for v in verdicts if v.exploratory]
    out = [Table("The paper's claims on this sweep", CLAIM_NOTE,
                 pd.DataFrame(_claim_rows(scoped)))]
    if explored:
        out.append(Table("Exploratory: the claims outside the paper's scope",
                         "The same rules on the sweep's real settings outside each claim's "
                         "scope (another dataset, model or shift): results of this sweep, not "
                         "the paper's claims.", pd.DataFrame(_claim_rows(explored))))
    return out


def not_encoded_table(paper: Paper) -> Table | None:
    if not paper.not_encoded:
        return None
    return Table("Statements not encoded as claims",
                 "What the paper states that a sweep's tables cannot decide, and why.",
                 pd.DataFrame({"Statement": paper.not_encoded}))


def claims_overview(sweep: Sweep) -> Table | None:
    """Every paper's claims that this sweep can decide, one table: what a report opens with, so
    a reader sees first whether each paper's method did what its paper says against the
    baselines the sweep ran beside it. None when the sweep can decide no claim."""
    measured = Measured(sweep)
    rows = []
    for name in paper_names():
        paper = load_paper(name)
        rows += _claim_rows([v for v in claims_module.evaluate(measured, paper)
                             if v.verdict != claims_module.UNTESTABLE], paper.name)
    if not rows:
        return None
    for row in rows:
        row.pop("Source")
    return Table("The papers' claims on this sweep",
                 "Each paper's claims that the sweep's real settings can decide (all of them, "
                 "with sources: `python -m raylf.report SWEEP --paper NAME`). " + CLAIM_NOTE,
                 pd.DataFrame(rows))


def build(sweep: Sweep, paper: Paper) -> Report:
    measured = Measured(sweep)
    covered = coverage(measured, paper)
    verdicts = claims_module.evaluate(measured, paper)
    if not any(_reported(c, paper, measured) for c in covered) and \
            all(v.verdict == claims_module.UNTESTABLE for v in verdicts):
        raise NothingToScore(
            f"{sweep.root} holds no setting of {paper.name}'s tables with a method they report "
            f"and none of its claims can be decided on it ({paper.name}'s methods: "
            f"{', '.join(sorted({f.method for f in paper.figures}))})")
    figures = [t for t in (figures_table(measured, paper, name, covered)
                           for name in dict.fromkeys(f.table for f in paper.figures)) if t]
    ranks = rank_agreement(measured, paper, covered)
    sections = [
        Section("Settings", [coverage_table(covered, paper, measured)] if covered else [],
                text="" if covered else "The sweep runs none of the paper's settings."),
        Section("Figures", figures, text="" if figures else (
            "No covered setting is comparable: no number is set against the paper's (see "
            "Settings for why).")),
        Section("Rank agreement", [ranks] if ranks else [],
                text="" if ranks else "No comparable setting: no ordering to compare."),
        Section("Claims", [*claims_tables(verdicts),
                           *filter(None, [not_encoded_table(paper)])]),
    ]
    summary = (f"{sweep.root} against {paper.citation}. {paper.note} "
               f"Trials: {len(measured.trials)} ok; settings: "
               f"{', '.join(dict.fromkeys(measured.trials['setting']))}.")
    standin = list(dict.fromkeys(measured.trials.loc[measured.trials["standin"], "setting"]))
    banner = [f"Stand-in data: {', '.join(standin)}. No figure there is compared with the "
              "paper's and no claim is decided on it."] if standin else []
    return Report(f"raylf scorecard: {paper.name} on {Path(str(sweep.root)).name}", summary,
                  sections, banner)


def write_scorecard(root: str, paper: str, out: str | None = None,
                    formats: tuple[str, ...] = ("md",)) -> dict[str, str]:
    """Render ``paper``'s scorecard of ``root`` into ``out`` (default ``<root>/report``) as
    ``scorecard-<paper>.md`` / ``.html`` / ``.tex``; returns the paths by format."""
    report = build(load(root), load_paper(paper))
    out = out or f"{str(root).rstrip('/')}/report"
    fs, base = results.filesystem(out)
    fs.create_dir(base, recursive=True)
    written = {}
    for fmt in formats:
        name = f"scorecard-{paper}{Path(FORMATS[fmt]).suffix}"
        with fs.open_output_stream(f"{base}/{name}") as stream:
            stream.write(RENDERERS[fmt](report).encode())
        written[fmt] = f"{out.rstrip('/')}/{name}"
    return written
