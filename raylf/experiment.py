"""Run one experiment on a backend and turn what it emits into the three result tables."""

from __future__ import annotations

import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raylf import results
from raylf.config import ExperimentSpec, SpecError
from raylf.data import build_federation
from raylf.runtime import Blueprint, open_runtime
from raylf.runtime.coordinator import RoundOutcome


@dataclass
class Progress:
    """Everything a resumed experiment needs besides the runtime's own checkpoint."""

    next_round: int = 1
    rounds: list[dict[str, Any]] = field(default_factory=list)
    clients: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0


@dataclass
class ExperimentResult:
    trial_id: str
    status: str
    error: str | None
    tables: dict[str, list[dict[str, Any]]]
    paths: dict[str, str] = field(default_factory=dict)

    @property
    def trial(self) -> dict[str, Any]:
        return self.tables["trials"][0]


def default_trial_id(spec: ExperimentSpec) -> str:
    return f"{spec.name}-{spec.method.name}-s{spec.seed}-{spec.digest()}"


RoundHook = Callable[[RoundOutcome, Any, Progress, Any], None]


def run_experiment(spec: ExperimentSpec, *, backend: str = "local", out: str | None = None,
                   trial_id: str | None = None, sweep: str = "", placement=None,
                   on_round: RoundHook | None = None, checkpoint_every: int | None = None,
                   progress: Progress | None = None, snapshot: Any = None,
                   reraise: bool = False, extra: dict[str, Any] | None = None) -> ExperimentResult:
    """Run ``spec`` round by round; write the tables under ``out`` whatever the outcome.

    ``on_round(outcome, runtime, progress, snapshot)`` runs after every round (progress
    printing, Tune reports); with ``checkpoint_every``, ``snapshot`` is the runtime's checkpoint
    after every ``checkpoint_every``-th round and the last one (not after a diverged round: the
    trial ends there), else None. The next round is started before
    the hook runs (the runtime may overlap it with the hook and the message latency), except
    after a round that is snapshotted. ``progress`` + ``snapshot`` resume a checkpointed
    experiment. ``extra`` adds columns to the trials row (e.g. a sweep's attempt count).
    Divergence (non-finite loss or parameters) ends it as ``diverged``; an exception as
    ``failed`` with the traceback, re-raised after the tables are written if ``reraise``.
    """
    trial_id = trial_id or default_trial_id(spec)
    progress = progress or Progress()
    status, error, diverged_round = "ok", None, None
    started = time.perf_counter() - progress.wall_s
    runtime = None
    failure: BaseException | None = None
    try:
        label = f"{trial_id}/{uuid.uuid4().hex[:6]}"  # unique actor names, retries included
        blueprint = Blueprint(spec, build_federation(spec))
        blueprint.method()  # incompatible method and data fail here, before any actor starts
        runtime = open_runtime(backend, blueprint, placement, label)
        if snapshot is not None:
            runtime.restore(snapshot)
        last = spec.federation.rounds
        for rnd in range(progress.next_round, last + 1):
            due = checkpoint_every is not None and (rnd == last or rnd % checkpoint_every == 0)
            outcome = runtime.run_round(rnd, then=None if due or rnd == last else rnd + 1)
            progress.rounds.append(outcome.record)
            progress.clients.extend(outcome.clients)
            progress.next_round = rnd + 1
            progress.wall_s = time.perf_counter() - started
            if outcome.diverged:
                status, diverged_round = "diverged", rnd
                error = (f"diverged in round {rnd}: a local loss was NaN/inf or above "
                         f"federation.divergence_loss={spec.federation.divergence_loss:g}, or the "
                         "aggregate was not finite; lower federation.optimizer.lr or set "
                         "federation.optimizer.grad_clip")
            if on_round is not None:
                taken = runtime.checkpoint() if due and not outcome.diverged else None
                on_round(outcome, runtime, progress, taken)
            if outcome.diverged:
                break
    except SpecError:
        raise  # impossible spec or resources: nothing ran, nothing to record
    except Exception as exc:  # recorded in the trials table, then optionally re-raised
        status, error, failure = "failed", traceback.format_exc(), exc
    finally:
        if runtime is not None:
            runtime.close()
    tables = {
        "trials": [trial_row(spec, trial_id, sweep, backend, status, error, diverged_round,
                             progress, time.perf_counter() - started) | (extra or {})],
        "rounds": [{"trial_id": trial_id, **r} for r in progress.rounds],
        "clients": [{"trial_id": trial_id, **c} for c in progress.clients],
    }
    result = ExperimentResult(trial_id, status, error, tables)
    if out is not None:
        result.paths = results.write_trial(out, trial_id, tables, spec.to_dict())
    if failure is not None and reraise:
        raise failure
    return result


def trial_row(spec: ExperimentSpec, trial_id: str, sweep: str, backend: str, status: str,
              error: str | None, diverged_round: int | None, progress: Progress,
              wall_s: float) -> dict[str, Any]:
    rounds = progress.rounds
    evaluated = [r for r in rounds if any(k.startswith("acc_") for k in r)]
    final = evaluated[-1] if evaluated else {}
    best = max((r for r in evaluated if "acc_mean" in r), key=lambda r: r["acc_mean"], default={})
    row: dict[str, Any] = {
        "trial_id": trial_id, "sweep": sweep, "name": spec.name, "method": spec.method.name,
        "dataset": spec.dataset.name, "scenario": spec.scenario.name, "model": spec.model.name,
        "seed": spec.seed, "backend": backend, "status": status, "error": error,
        "diverged_round": diverged_round, "rounds": len(rounds), "wall_s": wall_s,
        "bytes_up": sum(r["bytes_up"] for r in rounds),
        "bytes_down": sum(r["bytes_down"] for r in rounds),
    }
    row.update({k: v for k, v in final.items() if k.startswith(("acc_", "eval_loss", "auc"))})
    row["best_acc_mean"] = best.get("acc_mean")  # selected on test data: label it as such
    row["best_round"] = best.get("round")
    for key, value in spec.flat().items():
        row.setdefault(key, value)
    return row
