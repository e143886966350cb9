"""Run one experiment on a backend and turn what it emits into the three result tables."""

from __future__ import annotations

import math
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raylf import learning_check, metrics, results
from raylf.checkpoints import CheckpointFolders
from raylf.config import ResolvedSpec
from raylf.data import build_federation
from raylf.errors import SpecError
from raylf.runtime import Blueprint, open_runtime
from raylf.runtime.coordinator import RoundOutcome
from raylf.schema import name_problem


class RecordedStop(Exception):
    """Raised (e.g. by a round hook) to end a run early with ``status`` and this message as its
    recorded reason, instead of ``failed`` with a traceback: a time budget, a guard."""

    def __init__(self, status: str, message: str):
        self.status = status
        super().__init__(message)


@dataclass
class Progress:
    """Everything a resumed experiment needs besides the runtime's own checkpoint."""

    next_round: int = 1
    rounds: list[dict[str, Any]] = field(default_factory=list)
    clients: list[dict[str, Any]] = field(default_factory=list)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # method-defined
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


def default_trial_id(spec: ResolvedSpec) -> str:
    return f"{spec.name}-{spec.method.name}-s{spec.seed}-{spec.digest()}"


RoundHook = Callable[[RoundOutcome, Any, Progress, Any], None]


def run_experiment(spec: ResolvedSpec, *, backend: str = "local", out: str | None = None,
                   trial_id: str | None = None, sweep: str = "", placement=None,
                   on_round: RoundHook | None = None, checkpoint_every: int | None = None,
                   checkpoint_min_s: float = 0.0, checkpoint_last: bool = True,
                   progress: Progress | None = None,
                   snapshot: Any = None, reraise: bool = False,
                   extra: dict[str, Any] | None = None) -> ExperimentResult:
    """Run ``spec`` round by round; write the tables under ``out`` whatever the outcome.

    ``on_round(outcome, runtime, progress, snapshot)`` runs after every round (progress
    printing, Tune reports); with ``checkpoint_every``, ``snapshot`` is the runtime's checkpoint
    after every ``checkpoint_every``-th round before the last at least ``checkpoint_min_s`` after
    the previous one, and after the last one only with ``checkpoint_last`` (not after a diverged
    round: the trial ends there), else None. The time gate is applied here, before the snapshot
    is taken, because taking one is the cost: the workers' states are gathered and written, and
    the next round is not overlapped with the hook (a sweep of 100-round trials on tiny rounds
    took a snapshot every 5 rounds only to drop most of them for ``checkpoint_min_s``). A sweep
    leaves out the last one unless it keeps the final states: the tables follow at once, and
    after them no resume reads a checkpoint. The next round is started before
    the hook runs (the runtime may overlap it with the hook and the message latency), except
    after a round that is snapshotted. ``progress`` + ``snapshot`` resume a checkpointed
    experiment. ``extra`` adds columns to the trials row (e.g. a sweep's attempt count).
    Divergence (non-finite loss or parameters) ends it as ``diverged``; an exception as
    ``failed`` with the traceback, re-raised after the tables are written if ``reraise``.
    """
    trial_id = trial_id or default_trial_id(spec)
    problem = name_problem(trial_id)
    if problem is not None:  # it names the trial's files: no separator may take them elsewhere
        raise SpecError([("trial_id", f"{problem} (got {trial_id!r})")])
    progress = progress or Progress()
    status, error, diverged_round = "ok", None, None
    started = time.perf_counter() - progress.wall_s
    runtime = checkpoints = None
    finished = False  # ended without an exception: the runtime's actors may serve the next run
    failure: BaseException | None = None
    applied: dict[str, Any] = {}  # the input normalization's columns, once the data are built
    digests: dict[str, str] = {}  # the data's and the partition's, once the data are built
    origin: str | None = None  # where the data come from (SourceData.origin), once loaded
    try:
        label = f"{trial_id}/{uuid.uuid4().hex[:6]}"  # unique actor names, retries included
        blueprint = Blueprint(spec, build_federation(spec))
        applied = blueprint.federation.normalization.columns()
        digests = blueprint.federation.digests()
        origin = blueprint.federation.origin
        blueprint.method()  # incompatible method and data fail here, before any actor starts
        runtime = open_runtime(backend, blueprint, placement, label)
        if snapshot is not None:
            runtime.restore(snapshot)
        setup = runtime.setup()
        if setup is not None:
            progress.rounds.append(setup.record)
        last = spec.federation.rounds
        checkpoints = CheckpointFolders(out, trial_id)
        last_taken = -math.inf  # monotonic time of the last snapshot
        for rnd in range(progress.next_round, last + 1):
            due = checkpoint_every is not None and (
                checkpoint_last if rnd == last else rnd % checkpoint_every == 0
                and time.monotonic() - last_taken >= checkpoint_min_s)
            outcome = runtime.run_round(rnd, then=None if due or rnd == last else rnd + 1)
            progress.rounds.append(outcome.record)
            progress.clients.extend(outcome.clients)
            for name, rows in outcome.tables.items():
                progress.tables.setdefault(name, []).extend(rows)
            progress.next_round = rnd + 1
            progress.wall_s = time.perf_counter() - started
            if outcome.diverged:
                status, diverged_round = "diverged", rnd
                error = (f"diverged in round {rnd}: a local loss was NaN/inf or above "
                         f"federation.divergence_loss={spec.federation.divergence_loss:g}, or a "
                         "client's personal state or the aggregate was not finite; lower "
                         "federation.optimizer.lr or set federation.optimizer.grad_clip")
            if on_round is not None:
                taken = None
                if due and not outcome.diverged:
                    taken = runtime.checkpoint(checkpoints.folder(rnd))
                    last_taken = time.monotonic()
                on_round(outcome, runtime, progress, taken)
                if taken is not None:
                    checkpoints.reported(rnd)
            if outcome.diverged:
                break
        finished = True
    except SpecError:
        raise  # impossible spec or resources: nothing ran, nothing to record
    except RecordedStop as exc:  # a budget or guard ended the run: its own status and reason
        status, error = exc.status, str(exc)
        finished = True
    except Exception as exc:  # recorded in the trials table, then optionally re-raised
        status, error, failure = "failed", traceback.format_exc(), exc
    finally:
        if runtime is not None:
            runtime.close(finished)
        if checkpoints is not None:
            checkpoints.close()
    env = run_environment(progress, digests)
    tables = {
        "trials": [trial_row(spec, trial_id, sweep, backend, status, error, diverged_round,
                             progress, time.perf_counter() - started) |
                   {"data_origin": origin} | applied | {f"env.{k}": v for k, v in env.items()} |
                   (extra or {})],
        "rounds": [{"trial_id": trial_id, **r} for r in progress.rounds],
        "clients": [{"trial_id": trial_id, **c} for c in progress.clients],
        **{name: [{"trial_id": trial_id, **r} for r in rows]
           for name, rows in progress.tables.items()},
    }
    result = ExperimentResult(trial_id, status, error, tables)
    if out is not None:
        result.paths = results.write_trial(out, trial_id, tables, spec.resolved(), env)
    if failure is not None and reraise:
        raise failure
    return result


def run_environment(progress: Progress, digests: dict[str, str]) -> dict[str, Any]:
    """``raylf.results.environment`` plus what only the run knows: the devices its clients
    trained on (every round's ``worker_device``, a retried trial's included) and the digests of
    its data and partition."""
    devices = {d for r in progress.rounds for d in str(r.get("worker_device") or "").split("; ")}
    return {**results.environment(), "device": "; ".join(sorted(devices - {""})) or None,
            **digests}


def trial_row(spec: ResolvedSpec, trial_id: str, sweep: str, backend: str, status: str,
              error: str | None, diverged_round: int | None, progress: Progress,
              wall_s: float) -> dict[str, Any]:
    rounds = progress.rounds
    evaluated = [r for r in rounds if metrics.evaluates(r)]
    final = evaluated[-1] if evaluated else {}
    best = max((r for r in evaluated if "acc_mean" in r), key=lambda r: r["acc_mean"], default={})
    row: dict[str, Any] = {
        "trial_id": trial_id, "sweep": sweep, "name": spec.name, "method": spec.method.name,
        "dataset": spec.dataset.name, "scenario": spec.scenario.name, "model": spec.model.name,
        "seed": spec.seed, "backend": backend, "status": status, "error": error,
        "round_unit": spec.method_class.round_unit,
        "oracle": spec.method_class.oracle,
        "proposed_in": spec.method_class.proposed_in,
        "diverged_round": diverged_round, "rounds": len(rounds), "wall_s": wall_s,
        "bytes_up": sum(r["bytes_up"] for r in rounds),
        "bytes_down": sum(r["bytes_down"] for r in rounds),
    }
    row.update({k: v for k, v in final.items()
                if k.startswith(("acc_", "eval_loss", "auc", "val_"))})
    row["best_acc_mean"] = best.get("acc_mean")  # selected on test data: label it as such
    row["best_round"] = best.get("round")
    chosen = max((r for r in evaluated if r.get("val_acc_mean") is not None),
                 key=lambda r: r["val_acc_mean"], default={})
    row["best_val_round"] = chosen.get("round")  # selected on validation data
    row["best_val_acc_mean"] = chosen.get("val_acc_mean")
    row["acc_mean_at_best_val"] = chosen.get("acc_mean")  # the test figure to report
    row["warning"] = learning_check.not_learning(rounds)
    for key, value in spec.flat().items():
        row.setdefault(key, value)
    return row
