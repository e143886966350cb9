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


@dataclass(frozen=True)
class Setting:
    """A paper's column of results, as raylf runs it. ``fields`` are the trials-table columns a
    comparable run agrees on (the preset's, then the paper's and the setting's own); ``match``
    names those that make a run the same *kind* of setting (the shift it simulates), so a run on
    other data is still recognized, and told apart as not comparable."""

    id: str
    preset: str
    fields: dict[str, Any]
    match: tuple[str, ...]
    epochs: float | None = None  # passes over each client's data, where the paper gives them


@dataclass(frozen=True)
class Figure:
    """One published number with where it was read and what raylf cell it maps to. ``mean``
    and ``std`` are in the paper's ``unit`` (bytes for communication)."""

    paper: str
    file: str
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
class Claim:
    """A statement of the paper about orderings, checked on a sweep's own settings."""

    name: str
    kind: str
    methods: tuple[str, ...]
    metrics: tuple[str, ...]
    over: str  # "setting": in every setting that holds the methods; "macro": on their mean
    source: str
    against: tuple[str, ...] = ()
    rank: int | None = None


@dataclass(frozen=True)
class Paper:
    name: str
    title: str
    file: str
    note: str  # what a reader of the scorecard must know about the recorded figures
    references: tuple[str, ...]
    settings: dict[str, Setting]
    figures: list[Figure] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)


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
        return _paper(raw)
    except (KeyError, TypeError, ValueError) as err:
        raise PaperDataError(f"{name}.yaml: {err}") from err


def _paper(raw: dict) -> Paper:
    settings = {sid: _setting(sid, spec, raw) for sid, spec in raw["settings"].items()}
    paper = Paper(raw["paper"], raw["title"], raw["file"], raw["note"],
                  tuple(raw.get("references", [])), settings)
    for table in raw["tables"]:
        paper.figures.extend(_figures(paper, table))
    paper.claims.extend(_claim(c) for c in raw.get("claims", []))
    return paper


def _setting(sid: str, spec: dict, raw: dict) -> Setting:
    if spec["preset"] not in presets.PRESETS:
        raise ValueError(f"setting {sid}: unknown preset {spec['preset']!r}")
    fields = dict(flatten(presets.get(spec["preset"])))
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
            out.append(Figure(paper.name, paper.file, table["table"], row["row"], column,
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


def _claim(raw: dict) -> Claim:
    methods = raw.get("methods", [raw["method"]] if "method" in raw else [])
    return Claim(raw["name"], raw["kind"], tuple(methods), tuple(raw["metrics"]), raw["over"],
                 raw["source"], tuple(raw.get("against", [])), raw.get("rank"))
