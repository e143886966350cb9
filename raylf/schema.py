"""The experiment spec's schema: what a spec file may hold, as written, and its structure checked.

A spec names its components (dataset, scenario, model, method) and gives their parameters; which
names exist and what their parameters mean is the registries' business, one floor up
(``raylf.config`` resolves a spec against them). This module imports none of them, so everything
from the data layer to the methods may use the schema without importing what uses it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from raylf.errors import SpecError


class SpecLoader(yaml.SafeLoader):
    """YAML as specs mean it: only ``true`` / ``false`` are booleans (YAML 1.2).

    PyYAML follows YAML 1.1, where ``off``, ``on``, ``yes``, ``no``, ``y`` and ``n`` are booleans
    too, so ``resources.cohort: off`` reached the validator as ``False``. Read as strings, those
    words still fill boolean fields (pydantic accepts them) and fill enumerated fields as written.
    """


SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"))


def read_yaml(text: str) -> Any:
    """A spec file's or a ``--set`` value's YAML, booleans as in YAML 1.2 (:class:`SpecLoader`)."""
    return yaml.load(text, Loader=SpecLoader)  # noqa: S506 - a SafeLoader subclass


# A name becomes a folder or file name under the storage root (a sweep's directory, a trial's
# tables): no separator can take it elsewhere, and no leading dot can make it ``.``, ``..`` or
# hidden.
NAME_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$"


def name_problem(value: str) -> str | None:
    """Why ``value`` cannot name a sweep, an experiment or a trial; None when it can."""
    if re.fullmatch(NAME_PATTERN, value):
        return None
    return ("a name becomes a folder or file name under the storage: use letters, digits, "
            f"'_', '-' and '.', and do not start with '.' (pattern {NAME_PATTERN})")


def safe_name(value: str) -> str:
    """A pydantic field validator: :func:`name_problem` as a validation error."""
    problem = name_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


class Strict(BaseModel):
    # every number finite: an infinite lr or timeout is a typo, never a setting (a disabled
    # option is null), and would only surface later as a diverged or never-ending run
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class Component(BaseModel):
    """A named component (dataset, scenario, model) and its parameters as written: the keys
    beside ``name``, which the ``Params`` the component registered validates
    (``raylf.config``)."""

    model_config = ConfigDict(extra="allow")
    name: str

    def written(self) -> dict[str, Any]:
        """The component's parameters as the spec gives them."""
        return dict(self.model_extra or {})


class MethodSpec(Strict):
    """The method by name and its parameters as written (``method.params``)."""

    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class OptimizerSpec(Strict):
    """The local optimizer, one of a small declared set: ``sgd`` (``torch.optim.SGD``'s
    arithmetic: weight decay, momentum, lr) or ``adam`` (``torch.optim.Adam``'s: L2 weight
    decay, moments with ``betas``, ``eps``, bias correction); both after the proximal pull and
    gradient clipping (``raylf.training.sgd.step_``)."""

    name: Literal["sgd", "adam"] = "sgd"
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1, description="sgd only")
    betas: tuple[float, float] = Field((0.9, 0.999), description="adam only: the moments' decay")
    eps: float = Field(1e-8, gt=0, description="adam only: added to the second moment's root")
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float | None = Field(None, gt=0, description="max global gradient norm; none = off")

    @field_validator("betas")
    @classmethod
    def _decays(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in v):
            raise ValueError("each beta must be in [0, 1)")
        return v

    OWN: ClassVar[dict[str, frozenset[str]]] = {"sgd": frozenset({"momentum"}),
                                                  "adam": frozenset({"betas", "eps"})}
    """Each optimizer's own settings: set for another, they are refused; dumped (a spec's
    digest, the trials table's columns) only for the optimizer named."""

    @model_validator(mode="after")
    def _own_settings(self):
        foreign = sorted(k for name, keys in self.OWN.items() if name != self.name
                         for k in keys & self.model_fields_set)
        if foreign:
            raise ValueError(f"{', '.join(foreign)} belong to another optimizer than "
                             f"{self.name}; drop them or change name")
        return self

    @model_serializer(mode="wrap")
    def _dump_own_settings(self, handler):
        foreign = {k for name, keys in self.OWN.items() if name != self.name for k in keys}
        return {k: v for k, v in handler(self).items() if k not in foreign}


class FederationSpec(Strict):
    num_clients: int = Field(ge=1)
    participation: float = Field(1.0, gt=0, le=1, description="fraction of clients per round")
    rounds: int = Field(ge=1)
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=1)
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    divergence_loss: float = Field(
        1e4, gt=0, description="a client's mean local loss above this (or NaN/inf) = diverged")

    def participants_per_round(self) -> int:
        return max(1, round(self.participation * self.num_clients))


class ResourceSpec(Strict):
    workers: int = Field(2, ge=1, description="client-worker actors, each hosting a shard")
    cpus_per_worker: float = Field(1.0, gt=0)
    gpus_per_worker: float = Field(0.0, ge=0)
    coordinator_cpus: float = Field(
        0.25, gt=0, description="the coordinator actor's CPUs (a one-worker sweep trial has no "
                                "coordinator actor: its trial function trains, on one bundle)")
    round_timeout_s: float = Field(1800.0, gt=0, description="longest wait for one round")
    trial_timeout_s: float | None = Field(
        None, gt=0, description="wall-clock budget of one experiment, checked after each round; "
                                "over it the run ends with status timeout; none = no budget")
    client_data: Literal["auto", "sharded", "replicated"] = Field(
        "auto", description="sharded: each worker holds its own block of clients' data and trains "
                            "those; replicated: every worker holds all of it and a round's "
                            "participants are split to balance the work (methods without "
                            "per-client state only); auto: replicated when that is allowed and "
                            "the training data is at most 256 MiB")

    @field_validator("gpus_per_worker")
    @classmethod
    def _gpu_share(cls, v: float) -> float:
        if 0 < v < 1 and not math.isclose(1 / v, round(1 / v), rel_tol=1e-6):
            raise ValueError("a fractional GPU share must be 1/n (0.5, 0.25, 0.125, …)")
        if v >= 1 and v != int(v):
            raise ValueError("more than one GPU per worker must be a whole number")
        return v

    cohort: Literal["auto", "off"] | int = Field(
        "auto", description="clients a worker trains in lockstep (raylf.training.cohort): a "
                            "number, off (one after another), or auto (sized from the device's "
                            "free memory)")

    @field_validator("cohort", mode="before")
    @classmethod
    def _cohort_size(cls, v):
        if isinstance(v, bool):  # a bool is an int to pydantic: true would train cohorts of 1
            raise ValueError("give a number of clients, off or auto (got a boolean)")
        if isinstance(v, int) and v < 1:
            raise ValueError("a cohort holds at least 1 client (or use off / auto)")
        return v

    def threads_per_worker(self) -> int:
        return max(1, int(self.cpus_per_worker))


class ExperimentSpec(Strict):
    name: str = "experiment"
    _name = field_validator("name")(safe_name)
    seed: int = Field(0, ge=0)
    dataset: Component
    scenario: Component
    model: Component
    method: MethodSpec
    federation: FederationSpec
    eval_every: int = Field(1, ge=1)
    eval_clients: Literal["all"] | int | float = Field(
        "all", description="clients evaluated on evaluation rounds: all, a number, or a "
                           "fraction in (0, 1] (a seeded sample each round; the last round "
                           "always evaluates every client)")
    resources: ResourceSpec = Field(default_factory=ResourceSpec)

    @field_validator("eval_clients")
    @classmethod
    def _eval_clients(cls, v):
        if isinstance(v, bool) or (isinstance(v, int) and v < 1) or \
                (isinstance(v, float) and not 0 < v <= 1):
            raise ValueError("give all, a number of clients ≥ 1, or a fraction in (0, 1]")
        return v

    def active_workers(self) -> int:
        """Client workers a run starts: ``resources.workers``, never more than the clients (a
        worker hosts at least one)."""
        return min(self.resources.workers, self.federation.num_clients)

    def evaluated_per_round(self) -> int | None:
        """How many clients a non-final evaluation round scores (None: all)."""
        if self.eval_clients == "all":
            return None
        count = self.eval_clients if isinstance(self.eval_clients, int) else \
            math.ceil(self.eval_clients * self.federation.num_clients)
        return None if count >= self.federation.num_clients else count

    def evaluates(self, rnd: int) -> bool:
        """Whether round ``rnd`` is an evaluation round (every ``eval_every``-th, and the last)."""
        return rnd % self.eval_every == 0 or rnd == self.federation.rounds

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def digest(self) -> str:
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:10]

    def flat(self) -> dict[str, Any]:
        """Every scalar leaf as ``dotted.key: value`` (the trials table's config columns)."""
        return dict(flatten(self.to_dict()))


def flatten(tree: Any, prefix: str = ""):
    """``dotted.key: value`` pairs of a nested dict, lists as JSON: the form of the trials
    table's config columns."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from flatten(value, f"{prefix}{key}.")
    elif isinstance(tree, list):
        yield prefix[:-1], json.dumps(tree)
    else:
        yield prefix[:-1], tree


def _loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc)


def errors_of(err: ValidationError, prefix: str = "") -> list[tuple[str, str]]:
    out = []
    for e in err.errors():
        msg = "unknown field" if e["type"] == "extra_forbidden" else e["msg"]
        if e["type"] not in ("missing", "extra_forbidden") and "input" in e:
            msg += f" (got {e['input']!r})"
        out.append((prefix + _loc(e["loc"]), msg))
    return out


def parse(raw: Any, source: str | None = None) -> ExperimentSpec:
    """The spec's structure checked (sections, types, bounds), every error at once; its
    components' parameters are checked where they are resolved (``raylf.config.validate``)."""
    if not isinstance(raw, dict):
        raise SpecError([("", "a spec must be a mapping of fields")], source)
    try:
        return ExperimentSpec.model_validate(raw)
    except ValidationError as err:
        raise SpecError(errors_of(err), source) from None


def set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``value`` at ``dotted`` (``federation.optimizer.lr``) in a raw spec, creating the
    mappings on the way. The one setter behind command-line overrides, a sweep's ``overrides``
    and the specs tests and benchmarks build in code, so a path means the same everywhere."""
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SpecError([(dotted, f"{part!r} is not a mapping, cannot set a field inside it")])
        node = child
    node[leaf] = value


def set_dotted(tree: dict[str, Any], assignment: str) -> None:
    """Apply one ``dotted.key=value`` override; the value is read as YAML (numbers, lists, …)."""
    key, sep, text = assignment.partition("=")
    if not sep or not key:
        raise SpecError([(assignment, "an override must look like dotted.key=value")])
    set_path(tree, key.strip(), read_yaml(text) if text.strip() else None)


def load_raw(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise SpecError([("", f"spec file not found: {path}")])
    try:
        raw = read_yaml(path.read_text())
    except yaml.YAMLError as err:
        raise SpecError([("", f"not valid YAML: {err}")], str(path)) from None
    return raw if raw is not None else {}
