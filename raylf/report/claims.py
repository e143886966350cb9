"""The papers' claims as predicates over a sweep's own settings.

A claim is about an ordering ("HDC-FL has the highest worst-client accuracy", "FMT-SVM beats
FedPureCNN"), so it can be checked on any sweep that runs its methods side by side, on whatever
data: unlike a paper's figures, it needs no comparable setting. Stand-in settings are left out
(their numbers say nothing), and so are the references (``Paper.references``: oracles that
need the latent groups) wherever a claim ranks "all the other methods". A method with several
configurations in a setting is represented by its best one there.

Each claim kind decides from the same paired statistics as the report (``raylf.stats``: the
differences per seed and client, Wilcoxon's signed-rank test at ``ALPHA``), so that a claim
does not hold on noise:

- ``beats``: *holds* where the method is better than each named one and the test rejects,
  *does not hold* where it is worse and the test rejects, *tied* otherwise;
- ``best``: holds where the method has the best mean; not holding needs a significantly better
  method, else tied; ``competitive``: holds where the method is best or tied with the best;
- ``top``: the best of the claim's methods ranks within ``rank`` by mean (the papers highlight
  by mean, so no test);
- ``fewer_bytes``: upload per client per round, which is deterministic (no test).

``over: setting`` decides in every setting that holds the methods; ``over: macro`` on the means
over the settings they all share (``raylf.stats.shared_block``), pairing across settings by
(setting, seed, client). A claim holds where it holds in every setting (and on every metric
it names), does not hold where it fails in one, and is tied otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import pandas as pd

from raylf.report.measured import Measured
from raylf.report.papers import LOWER_IS_BETTER, Claim, Paper
from raylf.stats import ALPHA, Paired, paired, shared_block

HOLDS, FAILS, TIED, UNTESTABLE = "holds", "does not hold", "tied", "not testable here"
FEW_PAIRS = 5  # with fewer pairs no two-sided Wilcoxon p falls below 0.05 (exact or normal)


@dataclass
class Verdict:
    claim: Claim
    verdict: str
    where: str  # the settings it was decided on, or why it could not be
    numbers: str


def better(metric: str) -> bool:
    return metric not in LOWER_IS_BETTER


def show(metric: str, value: float) -> str:
    """A value as the papers print it: accuracies in percent, communication in bytes."""
    if pd.isna(value):
        return "-"
    return f"{value:,.0f} B" if metric.startswith("bytes") else f"{100 * value:.2f}"


def _difference(metric: str, delta: float) -> str:
    return f"{delta:+,.0f} B" if metric.startswith("bytes") else f"{100 * delta:+.2f} points"


class Evidence:
    """A claim's view of one metric: per (setting, configuration) means over ok seeds of the
    non-stand-in settings, each method's best configuration, and paired differences."""

    def __init__(self, measured: Measured, metric: str, references: tuple[str, ...]):
        self.metric = metric
        self.higher = better(metric)
        means = measured.means(metric)
        standin = set(measured.trials.loc[measured.trials["standin"], "setting"])
        self.means = means[~means.index.get_level_values("setting").isin(standin)]
        self.references = set(references)
        self._measured = measured
        self._picks: dict[str, pd.DataFrame] = {}

    @cached_property
    def _pairs(self) -> pd.DataFrame:
        return self._measured.pairs(self.metric)

    def settings(self) -> list[str]:
        return list(dict.fromkeys(self.means.index.get_level_values("setting")))

    def picks(self, setting: str) -> pd.DataFrame:
        """Per method in ``setting``: its best configuration and that one's mean."""
        if setting not in self._picks:
            here = self.means.loc[setting].sort_values("mean", ascending=not self.higher)
            first = here.groupby("method", sort=False).head(1)
            self._picks[setting] = first.reset_index().set_index("method")[["config", "mean"]]
        return self._picks[setting]

    def methods(self, setting: str, ranked_only: bool = False) -> list[str]:
        found = list(self.picks(setting).index)
        return [m for m in found if m not in self.references] if ranked_only else found

    def mean(self, method: str, settings: list[str]) -> float:
        return float(pd.Series([self.picks(s).at[method, "mean"] for s in settings]).mean())

    def paired(self, a: str, b: str, settings: list[str]) -> Paired | None:
        """``a`` − ``b`` (their best configurations) over the pairs of ``settings``."""
        def series(method: str) -> pd.Series:
            parts = {}
            for setting in settings:
                config = self.picks(setting).at[method, "config"]
                rows = self._pairs[(self._pairs["setting"] == setting)
                                   & (self._pairs["entry"] == config)]
                parts[setting] = rows.groupby(["seed", "client_id"])["value"].mean()
            return pd.concat(parts, names=["setting"])
        return paired(series(a), series(b))

    def order(self, result: Paired | None) -> str:
        """TIED, or whether the first of the pair is significantly better / worse."""
        if result is None or result.p >= ALPHA or result.delta == 0:
            return TIED
        return HOLDS if (result.delta > 0) == self.higher else FAILS

    def describe(self, a: str, b: str, settings: list[str], result: Paired | None) -> str:
        text = (f"{a} {show(self.metric, self.mean(a, settings))} vs "
                f"{b} {show(self.metric, self.mean(b, settings))}")
        if result is None:
            return text + " (no shared pairs)"
        few = " (too few pairs to reject)" if result.pairs < FEW_PAIRS else ""
        return (text + f": Δ {_difference(self.metric, result.delta)}, Wilcoxon p = "
                f"{result.p:.2g}, {result.pairs} pairs{few}")


def _scopes(evidence: Evidence, claim: Claim,
            needed: Callable[[str], list[str] | None]) -> list[list[str]]:
    """The groups of settings a claim is decided on: each setting where ``needed`` (the methods
    it must hold there, None when it cannot be tested there) is satisfied, or, for a macro
    claim, the largest block of such settings that all share the same methods."""
    usable = [s for s in evidence.settings() if needed(s) is not None]
    if claim.over != "macro" or not usable:
        return [[s] for s in usable]
    methods = sorted({m for s in usable for m in needed(s)})
    present = pd.DataFrame({s: [m in evidence.methods(s) for m in methods] for s in usable},
                           index=methods)
    settings, block = shared_block(present)
    return [settings] if claim.methods[0] in block else []


def _label(scopes: list[list[str]], scope: list[str], claim: Claim) -> str:
    """The setting a number belongs to, where the claim was decided on several."""
    return "" if claim.over == "macro" or len(scopes) == 1 else f"{scope[0]}: "


def _combine(verdicts: list[str]) -> str:
    if verdicts and all(v == HOLDS for v in verdicts):
        return HOLDS
    return FAILS if FAILS in verdicts else TIED


def _where(scopes: list[list[str]], claim: Claim) -> str:
    if claim.over == "macro":
        return "mean over " + "; ".join(scopes[0])
    return "; ".join(s for scope in scopes for s in scope)


def _ranked(evidence: Evidence, claim: Claim):
    """Settings where the method ran with at least one other ranked (or named) method."""
    def needed(setting: str) -> list[str] | None:
        found = evidence.methods(setting)
        others = list(claim.against) or evidence.methods(setting, ranked_only=True)
        others = [m for m in others if m not in claim.methods]
        if claim.methods[0] not in found or not others or not set(others) <= set(found):
            return None
        return [claim.methods[0], *others]
    return needed


def best(evidence: Evidence, claim: Claim, competitive: bool = False) -> Verdict | None:
    needed = _ranked(evidence, claim)
    scopes = _scopes(evidence, claim, needed)
    if not scopes:
        return None
    method, verdicts, numbers = claim.methods[0], [], []
    for scope in scopes:
        others = [m for m in needed(scope[0]) if m != method and
                  all(m in evidence.methods(s) for s in scope)]
        leader = sorted(others, key=lambda m: evidence.mean(m, scope),
                        reverse=evidence.higher)[0]
        mine, theirs = evidence.mean(method, scope), evidence.mean(leader, scope)
        result = evidence.paired(method, leader, scope)
        if (mine >= theirs) if evidence.higher else (mine <= theirs):
            verdicts.append(HOLDS)
        else:
            order = evidence.order(result)
            verdicts.append(FAILS if order == FAILS else (HOLDS if competitive else TIED))
        numbers.append(_label(scopes, scope, claim)
                       + evidence.describe(method, leader, scope, result))
    return Verdict(claim, _combine(verdicts), _where(scopes, claim), "; ".join(numbers))


def competitive(evidence: Evidence, claim: Claim) -> Verdict | None:
    return best(evidence, claim, competitive=True)


def _all_named(evidence: Evidence, claim: Claim):
    """Settings that hold the method and every method it is set against."""
    def needed(setting: str) -> list[str] | None:
        wanted = [claim.methods[0], *claim.against]
        return wanted if set(wanted) <= set(evidence.methods(setting)) else None
    return needed


def beats(evidence: Evidence, claim: Claim) -> Verdict | None:
    method = claim.methods[0]
    scopes = _scopes(evidence, claim, _all_named(evidence, claim))
    if not scopes:
        return None
    verdicts, numbers = [], []
    for scope in scopes:
        for other in claim.against:
            result = evidence.paired(method, other, scope)
            verdicts.append(evidence.order(result))
            numbers.append(_label(scopes, scope, claim)
                           + evidence.describe(method, other, scope, result))
    return Verdict(claim, _combine(verdicts), _where(scopes, claim), "; ".join(numbers))


def top(evidence: Evidence, claim: Claim) -> Verdict | None:
    def needed(setting: str) -> list[str] | None:
        ranked = evidence.methods(setting, ranked_only=True)
        mine = [m for m in claim.methods if m in ranked]
        return ranked if mine and len(ranked) > claim.rank else None

    scopes = _scopes(evidence, claim, needed)
    if not scopes:
        return None
    verdicts, numbers = [], []
    for (setting,) in scopes:
        means = pd.Series({m: evidence.mean(m, [setting]) for m in needed(setting)})
        ranks = means.rank(ascending=not evidence.higher, method="min")
        mine = ranks[[m for m in claim.methods if m in ranks]]
        verdicts.append(HOLDS if mine.min() <= claim.rank else FAILS)
        numbers.append(_label(scopes, [setting], claim)
                       + f"{mine.idxmin()} ranks {int(mine.min())} of {len(ranks)} ("
                       + ", ".join(f"{m} {show(evidence.metric, v)}" for m, v in
                                   means.sort_values(ascending=not evidence.higher).items())
                       + ")")
    return Verdict(claim, _combine(verdicts), _where(scopes, claim), "; ".join(numbers))


def fewer_bytes(evidence: Evidence, claim: Claim) -> Verdict | None:
    method = claim.methods[0]
    scopes = _scopes(evidence, claim, _all_named(evidence, claim))
    if not scopes:
        return None
    verdicts, numbers = [], []
    for (setting,) in scopes:
        mine = evidence.mean(method, [setting])
        for other in claim.against:
            theirs = evidence.mean(other, [setting])
            verdicts.append(HOLDS if mine < theirs else FAILS)
            ratio = f" ({theirs / mine:.1f}x)" if mine > 0 else ""
            numbers.append(_label(scopes, [setting], claim)
                           + f"{method} {show(evidence.metric, mine)} vs {other} "
                           f"{show(evidence.metric, theirs)} per client per round{ratio}")
    return Verdict(claim, _combine(verdicts), _where(scopes, claim), "; ".join(numbers))


KINDS: dict[str, Callable[[Evidence, Claim], Verdict | None]] = {
    "best": best, "competitive": competitive, "beats": beats, "top": top,
    "fewer_bytes": fewer_bytes}


def evaluate(measured: Measured, paper: Paper) -> list[Verdict]:
    """Every claim of ``paper`` on ``measured``: decided on each of its metrics (all must hold),
    or not testable with the reason."""
    out = []
    for claim in paper.claims:
        found = [KINDS[claim.kind](Evidence(measured, metric, paper.references), claim)
                 for metric in claim.metrics]
        if any(v is None for v in found):
            out.append(Verdict(claim, UNTESTABLE, _missing(measured, claim), "-"))
            continue
        verdict = _combine([v.verdict for v in found])
        out.append(Verdict(claim, verdict, found[0].where,
                           " | ".join(f"{m}: {v.numbers}" if len(found) > 1 else v.numbers
                                      for m, v in zip(claim.metrics, found))))
    return out


def _missing(measured: Measured, claim: Claim) -> str:
    """Why a claim could not be decided: the methods no setting holds together."""
    trials = measured.trials
    ran = set(trials["method"])
    if not ran & set(claim.methods):
        return f"the sweep has no ok trial of {' or '.join(claim.methods)}"
    absent = [m for m in claim.against if m not in ran]
    if absent:
        return f"the sweep has no ok trial of {', '.join(absent)}"
    real = trials[~trials["standin"]]
    if real.empty:
        return "every setting ran on stand-in data"
    if claim.kind == "top":
        return f"no setting ranks more than {claim.rank} methods including {claim.methods[0]}"
    together = (" and ".join([claim.methods[0], *claim.against]) if claim.against
                else f"{claim.methods[0]} and another method")
    return (f"no setting holds {together} with {', '.join(claim.metrics)} values"
            + (" (only stand-in ones do)" if len(real) < len(trials) else ""))
