"""The source papers' published figures and claims, shipped as one YAML file per paper.

A file holds what a scorecard (``raylf.report.scorecard``) sets a sweep against: the paper's
*settings* (each a raylf preset, plus the fields the paper fixes beyond it), its *tables* (every
cell as printed, with the row and column it was read from) and its *claims* (predicates on
orderings, ``raylf.report.claims``). Cells are kept as printed so that a reader can find each
one in the paper's text; this module parses them and expands every cell into a :class:`Figure`
that carries its whole provenance, so nothing downstream reads a number without knowing where
it came from. How each file was read from the extracted text, and what was left out, is in the
file's opening comment.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

from raylf.data import presets
from raylf.schema import flatten

# how a printed figure relates to raylf's value of the same metric: raylf writes accuracies as
# fractions and communication in bytes
UNITS = {"percent": 100.0, "fraction": 1.0, "bytes": 1.0}
BYTE_SUFFIXES = {"B": 1.0, "KB": 1e3, "MB": 1e6}  # the papers' decimal units
CELL = re.compile(r"^\s*(?P<mean>-?\d+(?:\.\d+)?)\s*(?:±\s*(?P<std>\d+(?:\.\d+)?))?"
                  r"\s*(?P<suffix>%|B|KB|MB)?\s*$")
LOWER_IS_BETTER = frozenset({"acc_gap", "bytes_up_per_client_round"})


class PaperDataError(ValueError):
    """A paper file that does not parse: a shipped file is wrong, never the user's input."""


# where a dataset's files lie changes nothing about them (its digest says what they hold): never
# part of a paper's protocol
LOCATIONS = frozenset({"dataset.root", "dataset.path"})


@dataclass(frozen=True)
class Setting:
    """A paper's column of results, as raylf runs it. ``fields`` are the trials-table columns a
    comparable run agrees on, exactly: every dataset, scenario and model parameter of the preset
    resolved with its defaults (``raylf.config.ExperimentSpec.resolved``, file locations left
    out), then the paper's fields and the setting's own; ``match`` names those that make a run
    the same *kind* of setting (the shift it simulates), so a run on other data is still
    recognized, and told apart as not comparable."""

    id: str
    preset: str
    fields: dict[str, Any]
    match: tuple[str, ...]
    epochs: float | None = None  # passes over each client's data, where the paper gives them

    def scope_fields(self, extra: dict[str, Any]) -> dict[str, Any]:
        """What a sweep setting must agree on to lie inside a claim's scope here: the paper's
        data (dataset), model and kind of shift (``match``), plus the scope's own ``extra``
        fields (an ablation's "without pretrained initialization"). Its training length and
        the rest of the protocol decide comparability of figures, not the scope of an
        ordering."""
        keys = ["dataset.name", "model.name", *self.match]
        return {**{k: self.fields[k] for k in keys if k in self.fields}, **extra}


@dataclass(frozen=True)
class Figure:
    """One published number with where it was read and what raylf cell it maps to. ``mean``
    and ``std`` are in the paper's ``unit`` (bytes for communication)."""

    paper: str
    table: str
    row: str
    column: str
    printed: str
    setting: str
    method: str
    metric: str
    unit: str
    mean: float
    std: float | None


@dataclass(frozen=True)
class MethodRef:
    """A method a claim names, optionally one configuration of it (``hdcfl`` with
    ``groups: 1``: the paper's "one prototype" ablation), matched on the trials table's
    resolved ``method.params.*`` columns."""

    method: str
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        if not self.params:
            return self.method
        return f"{self.method}[{', '.join(f'{k}={v}' for k, v in self.params)}]"


@dataclass(frozen=True)
class Scope:
    """Where a paper makes a claim: some of its settings (``settings``), each with ``fields``
    fixed beyond it, in the paper's words (``text``). Outside it, a verdict is exploratory."""

    settings: tuple[str, ...]
    fields: dict[str, Any]
    text: str


KINDS = ("best", "top", "beats", "noninferior", "equivalent", "ordering", "fewer_bytes",
         "rises_with")
NEEDS = {"noninferior": "margin", "equivalent": "margin", "top": "rank", "rises_with": "field"}


@dataclass(frozen=True)
class Claim:
    """A statement about orderings, decided on a sweep by ``raylf.report.claims`` (whose
    docstring says what each kind means). ``methods``: the subject first (``top``: any of
    them; ``ordering``: best first); ``margin`` (equivalence, non-inferiority) is in the
    metric's unit (accuracy as a fraction); ``origin`` is ``paper`` for the paper's own
    statements and ``raylf`` for a sanity check of raylf's, never presented as the paper's."""

    name: str
    kind: str
    methods: tuple[MethodRef, ...]
    metrics: tuple[str, ...]
    over: str  # "setting": in every setting in scope that holds the methods; "macro": their mean
    source: str
    scope: Scope
    against: tuple[MethodRef, ...] = ()
    among: tuple[MethodRef, ...] = ()
    rank: int | None = None
    margin: float | None = None
    factor: float | None = None
    field: str | None = None
    origin: str = "paper"

    @property
    def subject(self) -> MethodRef:
        return self.methods[0]


@dataclass(frozen=True)
class Paper:
    name: str
    title: str
    authors: str  # as the text gives them ("" where the extracted text has none)
    note: str  # what a reader of the scorecard must know about the recorded figures
    settings: dict[str, Setting]
    figures: list[Figure] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    not_encoded: list[str] = field(default_factory=list)  # statements left out, with why

    @property
    def citation(self) -> str:
        """How a scorecard names the paper: its title (and authors where the text has them)."""
        return f"“{self.title}”" + (f" ({self.authors})" if self.authors else "")


def same(actual, expected) -> bool:
    """A trials-table value against a paper's: numbers by value, a null only by a missing
    value, anything else by its text (lists are JSON in the table)."""
    missing = actual is None or (isinstance(actual, float) and math.isnan(actual))
    if expected is None or missing:
        return expected is None and missing
    try:
        return math.isclose(float(actual), float(expected), rel_tol=1e-9, abs_tol=1e-12)
    except (TypeError, ValueError):
        return str(actual) == (json.dumps(expected) if isinstance(expected, list)
                               else str(expected))


def agrees(trials, fields: dict[str, Any]) -> bool:
    """Every row of ``trials`` (a trials-table frame) has each of ``fields`` at its value; a
    column the table lacks reads as missing."""
    return all(all(same(v, expected) for v in (trials[key] if key in trials else [None]))
               for key, expected in fields.items())


def names() -> list[str]:
    """The papers with a data file, as ``--paper`` accepts them."""
    return sorted(p.name.removesuffix(".yaml") for p in resources.files(__name__).iterdir()
                  if p.name.endswith(".yaml"))


@cache
def load(name: str) -> Paper:
    if name not in names():
        raise KeyError(f"no paper {name!r}; papers: {', '.join(names())}")
    raw = yaml.safe_load(resources.files(__name__).joinpath(f"{name}.yaml").read_text("utf-8"))
    try:
        return parse(raw)
    except (KeyError, TypeError, ValueError) as err:
        raise PaperDataError(f"{name}.yaml: {err}") from err


def parse(raw: dict) -> Paper:
    """A paper from its file's content (what ``load`` reads; tests build their own)."""
    settings = {sid: _setting(sid, spec, raw) for sid, spec in raw["settings"].items()}
    paper = Paper(raw["paper"], raw["title"], raw.get("authors", ""), raw["note"], settings,
                  not_encoded=list(raw.get("not_encoded", [])))
    for table in raw["tables"]:
        paper.figures.extend(_figures(paper, table))
    paper.claims.extend(_claim(c, settings) for c in raw.get("claims", []))
    return paper


def resolved_preset(name: str) -> dict[str, Any]:
    """The preset's dataset, scenario and model as they run, every parameter with its default
    (what ``ExperimentSpec.resolved`` records of them), flattened; the preset's own other
    fields (the client count) as they are."""
    from raylf.data.scenarios import SCENARIOS
    from raylf.data.sources import SOURCES
    from raylf.models import MODELS

    preset = presets.get(name)
    for part, registry in (("dataset", SOURCES), ("scenario", SCENARIOS), ("model", MODELS)):
        values = {k: v for k, v in preset[part].items() if k != "name"}
        params = registry.get(preset[part]["name"]).Params.model_validate(values)
        preset[part] = {"name": preset[part]["name"], **params.model_dump(mode="json")}
    return {k: v for k, v in flatten(preset) if k not in LOCATIONS}


def _setting(sid: str, spec: dict, raw: dict) -> Setting:
    if spec["preset"] not in presets.PRESETS:
        raise ValueError(f"setting {sid}: unknown preset {spec['preset']!r}")
    fields = resolved_preset(spec["preset"])
    fields.update(raw.get("fields", {}))
    fields.update(spec.get("fields", {}))
    match = tuple(spec.get("match", raw.get("match", ())))
    missing = [k for k in match if k not in fields]
    if not match or missing:
        raise ValueError(f"setting {sid}: match {list(match)} names fields it does not fix")
    return Setting(sid, spec["preset"], fields, match, spec.get("epochs", raw.get("epochs")))


def _figures(paper: Paper, table: dict) -> list[Figure]:
    """Every printed cell of ``table``, its keys merged from the table, its column and its row
    (the most specific wins); a null cell was left out (unreadable) and yields nothing."""
    columns = list(table["columns"].items())
    out = []
    for row in table["rows"]:
        if len(row["cells"]) != len(columns):
            raise ValueError(f"{table['table']}, row {row['row']!r}: {len(row['cells'])} cells "
                             f"for {len(columns)} columns")
        for (column, column_keys), printed in zip(columns, row["cells"]):
            if printed is None:
                continue
            keys = {**table.get("keys", {}), **column_keys, **row.get("keys", {})}
            if keys["setting"] not in paper.settings:
                raise ValueError(f"{table['table']}: unknown setting {keys['setting']!r}")
            mean, std = parse_cell(str(printed), keys["unit"])
            out.append(Figure(paper.name, table["table"], row["row"], column,
                              str(printed), keys["setting"], keys["method"], keys["metric"],
                              keys["unit"], mean, std))
    return out


def parse_cell(printed: str, unit: str) -> tuple[float, float | None]:
    """``"97.17 ± 0.62"`` → (97.17, 0.62); ``"2.06 KB"`` → (2060.0, None) for unit bytes."""
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit!r}")
    found = CELL.match(printed)
    if found is None:
        raise ValueError(f"cannot read the cell {printed!r}")
    suffix = found["suffix"]
    if suffix and (suffix in BYTE_SUFFIXES) != (unit == "bytes"):
        raise ValueError(f"the cell {printed!r} does not read as {unit}")
    scale = BYTE_SUFFIXES[suffix or "B"] if unit == "bytes" else 1.0
    std = found["std"]
    return float(found["mean"]) * scale, (float(std) * scale if std is not None else None)


def _ref(raw) -> MethodRef:
    if isinstance(raw, str):
        return MethodRef(raw)
    return MethodRef(raw["method"], tuple(sorted(raw.get("params", {}).items())))


def _claim(raw: dict, settings: dict[str, Setting]) -> Claim:
    name = raw["name"]
    if raw["kind"] not in KINDS:
        raise ValueError(f"claim {name!r}: unknown kind {raw['kind']!r} (kinds: {KINDS})")
    needed = NEEDS.get(raw["kind"])
    if needed and raw.get(needed) is None:
        raise ValueError(f"claim {name!r}: a {raw['kind']} claim needs {needed}")
    methods = [raw["method"]] if "method" in raw else raw["methods"]
    scope = raw["scope"]
    unknown = [s for s in scope["settings"] if s not in settings]
    if not scope["settings"] or unknown:
        raise ValueError(f"claim {name!r}: scope names no setting of the paper ({unknown})")
    if not raw.get("source") or raw.get("origin", "paper") not in ("paper", "raylf"):
        raise ValueError(f"claim {name!r}: needs a source and an origin of paper or raylf")
    return Claim(name, raw["kind"], tuple(map(_ref, methods)), tuple(raw["metrics"]),
                 raw["over"], raw["source"],
                 Scope(tuple(scope["settings"]), dict(scope.get("fields", {})), scope["text"]),
                 tuple(map(_ref, raw.get("against", []))), tuple(map(_ref, raw.get("among", []))),
                 raw.get("rank"), raw.get("margin"), raw.get("factor"), raw.get("field"),
                 raw.get("origin", "paper"))
