"""The papers' claims decided on a sweep: every verdict rule, in one place.

A claim (``raylf.report.papers``: its kind, methods, metrics, scope and source) is decided on
the sweep's real settings; stand-in settings never decide anything. Its *scope* is where the
paper makes it (some of the paper's settings); a sweep setting lies inside it when it has the
paper's dataset, model and kind of shift (``Setting.scope_fields``). The claim is decided
inside its scope; on the sweep's other real settings it is decided the same way but shown apart,
labelled *exploratory*, never as the paper's claim. Oracles (``Method.oracle``) are references:
never ranked among "the other methods", compared only where a claim names them. A method, or a
configuration of it a claim names (``hdcfl[groups=1]``), is represented in a setting by its
best configuration there on the claim's metric.

Verdicts:

- *holds* / *does not hold*: the claim's decisions all went for it / one went against it;
- *not shown*: a test could have reached the level with these pairs, and did not;
- *undecidable*: a test cannot reach the level with this many pairs whatever the data: the
  smallest p it can give on them (``raylf.stats.one_sided``) is at least ``ALPHA``. Five pairs
  under the exact test give at best p = 0.0625: SP-CACW's own protocol (one target, five seeds)
  can decide none of its tests;
- *not testable here*: no setting in reach holds the claim's methods.

A claim that has several decisions (settings, methods it is set against, metrics) combines
them: does not hold if one does not, else undecidable if one is, else not shown if one is, else
holds.

Tests. Methods are compared on paired differences d = a − b (by seed and client where the
clients table has them, else by seed: ``Measured.pairs``; oriented so that d > 0 is better for
a), by Wilcoxon's signed-rank test run one-sided and read as two-sided (twice the one-sided p),
so every conclusion is drawn at the level of the two-sided test:

- ``beats``: for: d > 0; against: d < 0;
- ``noninferior`` (margin m, against the strongest other method): for: d > −m; against: d < −m;
- ``equivalent`` (margin m, two one-sided tests): for: −m < d < m, both tests rejecting (twice
  the larger p; the 95 % signed-rank interval lies inside ±m); against: d < −m or d > m (twice
  the smaller p);
- ``ordering`` a > b > c: ``beats`` for each neighbouring pair;
- ``rises_with`` a field: ``beats`` of the method at the field's highest value over itself at
  its lowest, between settings that differ in nothing else (the same partition per seed).

A test goes for or against where its p, Holm-adjusted over every test of the same family (the
claims a report decides on one sweep inside their scopes; separately, the exploratory ones), is
below ``ALPHA``. Margins are part of the claim and printed with it.

Decisions the papers make by the numbers, without a test:

- ``best``: the method's mean is the highest of the candidates (every ranked method, or the
  claim's ``among``); a method numerically behind does not have it, however small the gap (the
  paired test against the runner-up is printed, not used);
- ``top``: the best of the claim's methods ranks within ``rank`` by mean;
- ``fewer_bytes``: upload per client per round, deterministic, at least ``factor`` times fewer.

``over: setting`` decides in every setting (in reach) that holds the methods; ``over: macro``
on means over the largest block of those settings that all share the methods
(``raylf.stats.shared_block``), pairing across settings; a method that ran there but outside
the block, or a setting of the scope the sweep lacks, is named in the verdict.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd

from raylf import stats
from raylf.labels import methods_with
from raylf.report.measured import Measured
from raylf.report.papers import LOWER_IS_BETTER, Claim, MethodRef, Paper, agrees, same
from raylf.stats import ALPHA, one_sided, shared_block

HOLDS, FAILS, NOT_SHOWN, UNDECIDABLE = "holds", "does not hold", "not shown", "undecidable"
UNTESTABLE = "not testable here"
PRECEDENCE = (FAILS, UNDECIDABLE, NOT_SHOWN)  # what a combination of decisions reports first


def better(metric: str) -> bool:
    return metric not in LOWER_IS_BETTER


def show(metric: str, value: float) -> str:
    """A value as the papers print it: accuracies in percent, communication in bytes, and the
    grouping diagnostics (silhouette, ARI) as they are."""
    if pd.isna(value):
        return "-"
    if metric.startswith("bytes"):
        return f"{value:,.0f} B"
    return f"{100 * value:.2f}" if "acc" in metric else f"{value:.3f}"


def _difference(metric: str, delta: float) -> str:
    if metric.startswith("bytes"):
        return f"{delta:+,.0f} B"
    return f"{100 * delta:+.2f} points" if "acc" in metric else f"{delta:+.3f}"


def combine(outcomes: list[str]) -> str:
    """Several decisions as one verdict (the module docstring)."""
    return next((o for o in PRECEDENCE if o in outcomes), HOLDS)


@dataclass
class Test:
    """One signed-rank decision: its two-sided-equivalent p for and against the claim, the
    smallest p the test could give on these pairs, and the Holm-adjusted p once the family is
    known."""

    text: str
    p_for: float
    p_against: float
    p_min: float
    method: str
    pairs: int
    adjusted: float = math.nan

    @property
    def p(self) -> float:
        """The p of the conclusion the data point to, which enters Holm's family."""
        return min(self.p_for, self.p_against)

    def outcome(self) -> str:
        if self.p_min >= ALPHA:
            return UNDECIDABLE
        if self.adjusted < ALPHA:
            return HOLDS if self.p_for <= self.p_against else FAILS
        return NOT_SHOWN

    def describe(self) -> str:
        holm = "" if math.isnan(self.adjusted) else f", Holm {self.adjusted:.2g}"
        text = (f"{self.text}; Wilcoxon ({self.method}, {self.pairs} pairs) p = "
                f"{self.p:.2g}{holm}")
        if self.outcome() == UNDECIDABLE:
            text += f": undecidable, its smallest attainable p is {self.p_min:.3g} ≥ {ALPHA}"
        return text


@dataclass
class Fixed:
    """A decision made by the numbers, as the paper makes it (best, rank, bytes)."""

    result: str
    text: str

    def outcome(self) -> str:
        return self.result

    def describe(self) -> str:
        return self.text


@dataclass
class Verdict:
    claim: Claim
    verdict: str
    where: str  # the settings it was decided on, or why it could not be
    numbers: str
    exploratory: bool = False
    parts: list = field(default_factory=list, repr=False)

    @property
    def scope(self) -> str:
        return ("exploratory: outside the paper's scope (" + self.claim.scope.text + ")"
                if self.exploratory else self.claim.scope.text)


class Evidence:
    """A claim's view of one metric: per (setting, configuration) means over ok seeds of the
    real settings, the configuration each method (or named configuration) is represented by,
    and paired values."""

    def __init__(self, measured: Measured, metric: str):
        self.metric = metric
        self.higher = better(metric)
        means = measured.means(metric)
        standin = set(measured.trials.loc[measured.trials["standin"], "setting"])
        self.means = means[~means.index.get_level_values("setting").isin(standin)]
        self._measured = measured
        self._picks: dict[tuple[str, MethodRef], str | None] = {}

    @cached_property
    def _pairs(self) -> pd.DataFrame:
        return self._measured.pairs(self.metric)

    @cached_property
    def _params(self) -> pd.DataFrame:
        """Each (setting, configuration)'s method parameters, from its first trial."""
        trials = self._measured.trials
        columns = [c for c in trials if c.startswith("method.params.")]
        return trials.groupby(["setting", "config"], sort=False)[columns].first()

    def settings(self) -> list[str]:
        return list(dict.fromkeys(self.means.index.get_level_values("setting")))

    def pick(self, setting: str, ref: MethodRef) -> str | None:
        """The configuration representing ``ref`` in ``setting``: the best on this metric of
        the configurations of its method that have its parameters; None when none ran."""
        key = (setting, ref)
        if key not in self._picks:
            here = self.means.loc[setting] if setting in self.settings() else self.means.iloc[:0]
            here = here[here["method"] == ref.method]
            if ref.params and not here.empty:
                params = self._params.loc[setting].reindex(here.index)
                wanted = [all(same(params.at[c, f"method.params.{k}"]
                                    if f"method.params.{k}" in params else None, v)
                              for k, v in ref.params) for c in here.index]
                here = here[wanted]
            ranked = here.sort_values("mean", ascending=not self.higher)
            self._picks[key] = None if ranked.empty else str(ranked.index[0])
        return self._picks[key]

    def has(self, setting: str, ref: MethodRef) -> bool:
        return self.pick(setting, ref) is not None

    def ranked(self, setting: str) -> list[MethodRef]:
        """Every method that ran in ``setting`` except the oracles, as plain references."""
        if setting not in self.settings():
            return []
        methods = dict.fromkeys(self.means.loc[setting]["method"])
        oracles = set(methods_with(self._measured.trials, "oracle"))
        return [MethodRef(m) for m in methods if m not in oracles]

    def mean(self, ref: MethodRef, settings: list[str]) -> float:
        return float(np.mean([self.means.loc[(s, self.pick(s, ref)), "mean"] for s in settings]))

    def series(self, ref: MethodRef, settings: list[str]) -> pd.Series:
        """``ref``'s values indexed by (setting, seed, client) over ``settings``."""
        parts = {}
        for setting in settings:
            rows = self._pairs[(self._pairs["setting"] == setting)
                               & (self._pairs["entry"] == self.pick(setting, ref))]
            parts[setting] = rows.groupby(["seed", "client_id"])["value"].mean()
        return pd.concat(parts, names=["setting"])

    def test(self, a: pd.Series, b: pd.Series, label_a: str, label_b: str, kind: str,
             margin: float = 0.0) -> Test | None:
        """``a`` against ``b`` (indexed alike) by the rule of ``kind`` (the module docstring);
        None when they share no pair."""
        d = stats.differences(a, b) if self.higher else stats.differences(b, a)
        if d is None:
            return None
        summary = stats.paired(a, b)
        if kind == "equivalent":
            low, high = one_sided(d, -margin, "greater"), one_sided(d, margin, "less")
            below, above = one_sided(d, -margin, "less"), one_sided(d, margin, "greater")
            p_for, p_against = 2 * max(low.p, high.p), 2 * min(below.p, above.p)
            p_min = min(2 * max(low.p_min, high.p_min), 2 * min(below.p_min, above.p_min))
            method = low.method
        else:  # beats (margin 0) and noninferior
            up, down = one_sided(d, -margin, "greater"), one_sided(d, -margin, "less")
            p_for, p_against, p_min, method = 2 * up.p, 2 * down.p, 2 * up.p_min, up.method
        delta = _difference(self.metric, summary.delta)
        text = (f"{label_a} {show(self.metric, float(a.mean()))} vs {label_b} "
                f"{show(self.metric, float(b.mean()))}: Δ {delta}")
        if not math.isnan(summary.low):
            text += (f" [95 % CI {_difference(self.metric, summary.low)}, "
                     f"{_difference(self.metric, summary.high)}]")
        if margin:
            text += f", margin {_difference(self.metric, margin).lstrip('+')}"
        return Test(text, min(1.0, p_for), min(1.0, p_against), min(1.0, p_min), method,
                    len(d))


@dataclass
class Reach:
    """The settings a claim is decided on, in one family (in scope, or exploratory)."""

    settings: list[str]
    exploratory: bool
    missing: list[str] = field(default_factory=list)  # scope settings the sweep does not run


def _label(groups: list[list[str]], group: list[str], claim: Claim) -> str:
    """The setting a number belongs to, where the claim was decided on several."""
    return "" if claim.over == "macro" or len(groups) == 1 else f"{group[0]}: "


def _groups(evidence: Evidence, claim: Claim, reach: list[str],
            needed: Callable[[str], list[MethodRef] | None]) -> tuple[list[list[str]], str]:
    """The groups of settings a claim is decided on (each usable setting; for a macro claim
    the largest block of them sharing the methods) and what a macro block left out."""
    usable = [s for s in reach if needed(s) is not None]
    if claim.over != "macro" or not usable:
        return [[s] for s in usable], ""
    refs = list(dict.fromkeys(r for s in usable for r in needed(s)))
    present = pd.DataFrame({s: [evidence.has(s, r) for r in refs] for s in usable},
                           index=[r.label for r in refs])
    settings, block = shared_block(present)
    if claim.subject.label not in block or any(
            r.label not in block for r in (*claim.against, *claim.methods[1:])):
        return [], ""
    dropped = [label for label in present.index if label not in block]
    left = [s for s in usable if s not in settings]
    notes = ([f"dropped (not in every setting of the block): {', '.join(dropped)}"]
             if dropped else []) + ([f"settings left out: {', '.join(left)}"] if left else [])
    return [settings], "; ".join(notes)


def _others(evidence: Evidence, claim: Claim, setting: str) -> list[MethodRef]:
    """What a best or noninferior claim's subject is ranked against in ``setting``: ``among``
    (or every ranked method), less the subject's own method."""
    pool = list(claim.among) or evidence.ranked(setting)
    mine = claim.subject
    return [r for r in pool if r != mine and (claim.among or r.method != mine.method)]


def _ranked_needed(evidence: Evidence, claim: Claim):
    def needed(setting: str) -> list[MethodRef] | None:
        others = [r for r in _others(evidence, claim, setting) if evidence.has(setting, r)]
        if not evidence.has(setting, claim.subject) or not others:
            return None
        return [claim.subject, *others]
    return needed


def _named_needed(evidence: Evidence, refs: tuple[MethodRef, ...]):
    def needed(setting: str) -> list[MethodRef] | None:
        return list(refs) if all(evidence.has(setting, r) for r in refs) else None
    return needed


def _candidates(evidence: Evidence, claim: Claim, group: list[str]) -> list[MethodRef]:
    needed = _ranked_needed(evidence, claim)
    return [r for r in needed(group[0])[1:] if all(evidence.has(s, r) for s in group)]


def best(evidence: Evidence, claim: Claim, reach: list[str]):
    groups, note = _groups(evidence, claim, reach, _ranked_needed(evidence, claim))
    parts = []
    for group in groups:
        mine = evidence.mean(claim.subject, group)
        others = sorted(_candidates(evidence, claim, group),
                        key=lambda r: evidence.mean(r, group), reverse=evidence.higher)
        leader = others[0]
        theirs = evidence.mean(leader, group)
        ahead = mine >= theirs if evidence.higher else mine <= theirs
        test = evidence.test(evidence.series(claim.subject, group),
                             evidence.series(leader, group), claim.subject.label, leader.label,
                             "beats")
        lead = ("" if test is None else
                f" (paired: Δ {_difference(evidence.metric, mine - theirs)}, Wilcoxon p = "
                f"{test.p:.2g}, {test.pairs} pairs, shown, not used)")
        word = "highest" if evidence.higher else "lowest"
        text = (f"{claim.subject.label} {show(evidence.metric, mine)} "
                + (f"is the {word} of {len(others) + 1}; next {leader.label} "
                   if ahead else f"is behind {leader.label} ")
                + show(evidence.metric, theirs) + lead)
        parts.append(Fixed(HOLDS if ahead else FAILS, _label(groups, group, claim) + text))
    return groups, parts, note


def noninferior(evidence: Evidence, claim: Claim, reach: list[str]):
    groups, note = _groups(evidence, claim, reach, _ranked_needed(evidence, claim))
    parts = []
    for group in groups:
        others = sorted(_candidates(evidence, claim, group),
                        key=lambda r: evidence.mean(r, group), reverse=evidence.higher)
        test = evidence.test(evidence.series(claim.subject, group),
                             evidence.series(others[0], group), claim.subject.label,
                             f"the strongest, {others[0].label},", "noninferior", claim.margin)
        if test is not None:
            test.text = _label(groups, group, claim) + test.text
            parts.append(test)
    return groups, parts, note


def _pairwise(evidence: Evidence, claim: Claim, reach: list[str],
              pairs: list[tuple[MethodRef, MethodRef]], kind: str):
    refs = tuple(dict.fromkeys(r for pair in pairs for r in pair))
    groups, note = _groups(evidence, claim, reach, _named_needed(evidence, refs))
    parts = []
    for group in groups:
        for a, b in pairs:
            test = evidence.test(evidence.series(a, group), evidence.series(b, group), a.label,
                                 b.label, kind, claim.margin or 0.0)
            if test is not None:
                test.text = _label(groups, group, claim) + test.text
                parts.append(test)
    return groups, parts, note


def beats(evidence: Evidence, claim: Claim, reach: list[str]):
    pairs = [(m, other) for m in claim.methods for other in claim.against]
    return _pairwise(evidence, claim, reach, pairs, "beats")


def equivalent(evidence: Evidence, claim: Claim, reach: list[str]):
    pairs = [(m, other) for m in claim.methods for other in claim.against]
    return _pairwise(evidence, claim, reach, pairs, "equivalent")


def ordering(evidence: Evidence, claim: Claim, reach: list[str]):
    pairs = list(zip(claim.methods, claim.methods[1:]))
    return _pairwise(evidence, claim, reach, pairs, "beats")


def top(evidence: Evidence, claim: Claim, reach: list[str]):
    def needed(setting: str) -> list[MethodRef] | None:
        ranked = evidence.ranked(setting)
        mine = [r for r in claim.methods if r in ranked]
        return ranked if mine and len(ranked) > claim.rank else None

    groups, note = _groups(evidence, claim, reach, needed)
    parts = []
    for group in groups:
        refs = [r for r in needed(group[0]) if all(evidence.has(s, r) for s in group)]
        means = pd.Series({r.label: evidence.mean(r, group) for r in refs})
        ranks = means.rank(ascending=not evidence.higher, method="min")
        mine = ranks[[r.label for r in claim.methods if r.label in ranks]]
        listing = ", ".join(f"{m} {show(evidence.metric, v)}" for m, v in
                            means.sort_values(ascending=not evidence.higher).items())
        parts.append(Fixed(HOLDS if mine.min() <= claim.rank else FAILS,
                           _label(groups, group, claim) + f"{mine.idxmin()} ranks "
                           f"{int(mine.min())} of {len(ranks)} ({listing})"))
    return groups, parts, note


def fewer_bytes(evidence: Evidence, claim: Claim, reach: list[str]):
    refs = (claim.subject, *claim.against)
    groups, note = _groups(evidence, claim, reach, _named_needed(evidence, refs))
    factor = claim.factor or 1.0
    parts = []
    for group in groups:
        mine = evidence.mean(claim.subject, group)
        for other in claim.against:
            theirs = evidence.mean(other, group)
            ratio = theirs / mine if mine > 0 else math.inf
            wanted = f", at least {factor:g}x asked" if claim.factor else ""
            parts.append(Fixed(
                HOLDS if mine < theirs and ratio >= factor else FAILS,
                _label(groups, group, claim) + f"{claim.subject.label} "
                f"{show(evidence.metric, mine)} vs {other.label} {show(evidence.metric, theirs)} "
                f"per client per round ({ratio:.1f}x fewer{wanted})"))
    return groups, parts, note


def rises_with(evidence: Evidence, claim: Claim, reach: list[str]):
    """The method at the field's highest value against itself at the lowest, between reached
    settings that differ in nothing else among the setting fields."""
    trials = evidence._measured.trials
    fields = [c for c in trials if c.startswith(("dataset.", "scenario.", "model.",
                                                 "federation.")) and c != claim.field]
    rows = trials[trials["setting"].isin(reach) & (trials["method"] == claim.subject.method)]
    rows = rows[[s is not None and evidence.has(s, claim.subject) for s in rows["setting"]]]
    if rows.empty or claim.field not in rows:
        return [], [], ""
    keyed = rows.groupby("setting", sort=False).first()
    others = keyed[fields].map(str).apply("|".join, axis=1)  # NaN as "nan", not dropped
    groups, parts = [], []
    for _, alike in keyed.groupby(others, sort=False):
        values = alike[claim.field].astype(float)
        if values.nunique() < 2:
            continue
        low, high = values.idxmin(), values.idxmax()
        group = [high, low]
        a = evidence.series(claim.subject, [high]).droplevel("setting")
        b = evidence.series(claim.subject, [low]).droplevel("setting")
        name = claim.field.rsplit(".", 1)[-1]
        test = evidence.test(a, b, f"{name} {values[high]:g}", f"{name} {values[low]:g}",
                             "beats")
        if test is not None:
            test.text = f"{low} → {high}: {test.text}"
            groups.append(group)
            parts.append(test)
    return groups, parts, ""


KINDS: dict[str, Callable] = {
    "best": best, "top": top, "beats": beats, "noninferior": noninferior,
    "equivalent": equivalent, "ordering": ordering, "fewer_bytes": fewer_bytes,
    "rises_with": rises_with}


def reach(measured: Measured, paper: Paper, claim: Claim) -> tuple[Reach, Reach]:
    """The sweep's real settings inside ``claim``'s scope and outside it, and the scope's
    settings the sweep does not run."""
    trials = measured.trials[~measured.trials["standin"]]
    inside, outside, found = [], [], set()
    for setting, here in trials.groupby("setting", sort=False):
        hits = [s for s in claim.scope.settings
                if agrees(here, paper.settings[s].scope_fields(claim.scope.fields))]
        found.update(hits)
        (inside if hits else outside).append(setting)
    missing = [s for s in claim.scope.settings if s not in found]
    return Reach(inside, False, missing), Reach(outside, True)


def _decide(measured: Measured, claim: Claim, where: Reach, evidence: dict[str, Evidence]):
    """Every metric's parts of ``claim`` on ``where``; None when a metric cannot be decided
    there."""
    decided = []
    for metric in claim.metrics:
        if metric not in evidence:
            evidence[metric] = Evidence(measured, metric)
        groups, parts, note = KINDS[claim.kind](evidence[metric], claim, where.settings)
        if not parts:
            return None
        decided.append((metric, groups, parts, note))
    return decided


def _verdict(claim: Claim, decided, where: Reach) -> Verdict:
    parts = [p for _, _, found, _ in decided for p in found]
    groups = decided[0][1]
    settings = list(dict.fromkeys(s for g in groups for s in g))
    place = ("mean over " if claim.over == "macro" else "") + "; ".join(settings)
    notes = [n for _, _, _, n in decided if n]
    if where.missing and not where.exploratory:
        notes.append(f"scope settings the sweep lacks: {', '.join(where.missing)}")
    if notes:
        place += " (" + "; ".join(dict.fromkeys(notes)) + ")"
    numbers = " | ".join(
        (f"{metric}: " if len(decided) > 1 else "") + "; ".join(p.describe() for p in found)
        for metric, _, found, _ in decided)
    return Verdict(claim, combine([p.outcome() for p in parts]), place, numbers,
                   where.exploratory, parts)


def evaluate(measured: Measured, paper: Paper) -> list[Verdict]:
    """Every claim of ``paper`` on ``measured``, inside its scope (or not testable, with the
    reason), then its exploratory verdict where settings outside the scope can decide it; each
    family's tests Holm-adjusted together."""
    evidence: dict[str, Evidence] = {}
    decided: list[tuple[Claim, Reach, list | None]] = []
    for claim in paper.claims:
        inside, outside = reach(measured, paper, claim)
        decided.append((claim, inside, _decide(measured, claim, inside, evidence)))
        explored = _decide(measured, claim, outside, evidence) if outside.settings else None
        if explored is not None:
            decided.append((claim, outside, explored))
    for exploratory in (False, True):
        family = [p for _, where, found in decided if found and where.exploratory == exploratory
                  for _, _, parts, _ in found for p in parts if isinstance(p, Test)]
        for test, adjusted in zip(family, stats.holm([t.p for t in family])):
            test.adjusted = adjusted
    out = []
    for claim, where, found in decided:
        if found is None:
            out.append(Verdict(claim, UNTESTABLE, _missing(measured, claim, where), "-"))
        else:
            out.append(_verdict(claim, found, where))
    return out


def _missing(measured: Measured, claim: Claim, where: Reach) -> str:
    """Why a claim could not be decided in its scope."""
    trials = measured.trials
    ran = set(trials["method"])
    named = [r.method for r in (*claim.methods, *claim.against, *claim.among)]
    if not ran & {r.method for r in claim.methods}:
        return f"the sweep has no ok trial of {' or '.join(r.label for r in claim.methods)}"
    absent = [m for m in dict.fromkeys(named) if m not in ran]
    if absent:
        return f"the sweep has no ok trial of {', '.join(absent)}"
    if trials[~trials["standin"]].empty:
        return "every setting ran on stand-in data"
    if not where.settings:
        return f"no real setting of the sweep lies in the claim's scope ({claim.scope.text})"
    return (f"no setting in the claim's scope ({claim.scope.text}) holds "
            f"{', '.join(dict.fromkeys(r.label for r in (*claim.methods, *claim.against)))}"
            f" with {', '.join(claim.metrics)} values")
