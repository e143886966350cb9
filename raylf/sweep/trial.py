"""The Tune function trial of a sweep: one experiment, reporting to Tune the rounds something
acts on (``ReportGate``) and every round to Ray's metrics, checkpointing, resuming from Tune's
checkpoint, and counting its attempts (``announce``).

A trial whose tables record an end for good is never run again (``finished_row``); once they
do, its checkpoints are dropped (``raylf.checkpoints``)."""

from __future__ import annotations

import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch
from ray import tune

from raylf import checkpoints, results
from raylf.metrics import evaluates
from raylf.sweep.placement import trains_inline
from raylf.sweep.search import objective_value, stop_mark
from raylf.sweep.writable import StorageUnwritable

RECORDED_ENDS = ("ok", "diverged", "timeout", "stopped")  # never run again once ended so


@dataclass(frozen=True)
class SharedStage:
    """The stage a trial belongs to, fetched from Ray's object store once per trial process.
    Tune runs trial after trial in one process (``reuse_actors``) and hands each its
    parameters anew; a grid stage holds every trial's spec (megabytes for thousands of
    trials), which each trial would otherwise fetch and unpickle again."""

    ref: Any  # ray.ObjectRef of the stage

    @classmethod
    def of(cls, stage) -> SharedStage:
        return cls(ray.put(stage))

    def get(self):
        key = self.ref.hex()
        if key not in _fetched:
            _fetched.clear()  # a process serves one sweep stage at a time
            _fetched[key] = ray.get(self.ref)
        return _fetched[key]


_fetched: dict[str, Any] = {}  # the stage this trial process fetched, by its reference


def _scalars(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if isinstance(v, (int, float)) and v is not None}


class TrialMetrics:
    """A trial's rounds as Ray metrics (the dashboard's metrics view, Prometheus, Grafana)."""

    TAGS = ("sweep", "trial_id", "method")

    def __init__(self, sweep: str, trial_id: str, method: str):
        from ray.util import metrics

        self.tags = {"sweep": sweep, "trial_id": trial_id, "method": method}
        self.round = metrics.Gauge("raylf_trial_round", "last finished round of a sweep trial",
                                   tag_keys=self.TAGS)
        self.accuracy = metrics.Gauge(
            "raylf_trial_accuracy", "client test accuracy of a sweep trial's last evaluation",
            tag_keys=(*self.TAGS, "stat"))
        self.bytes = metrics.Counter("raylf_trial_bytes", "bytes sent between coordinator and "
                                     "clients", tag_keys=(*self.TAGS, "direction"))

    def record(self, record: dict[str, Any]) -> None:
        self.round.set(record["round"], tags=self.tags)
        for key, value in record.items():
            if key.startswith(("acc_mean", "acc_worst")) and value is not None:
                self.accuracy.set(value, tags={**self.tags, "stat": key})
        for direction in ("up", "down"):
            if record.get(f"bytes_{direction}"):
                self.bytes.inc(record[f"bytes_{direction}"],
                               tags={**self.tags, "direction": direction})


def finished_row(root: str, trial_id: str, row: dict[str, Any] | None) -> dict[str, Any] | None:
    """The trial's trials-table row (``row``, as ``results.read_trial`` read it) if it ended
    for good and all three of its tables exist."""
    import pyarrow.fs as pafs

    if row is None or row["status"] not in RECORDED_ENDS:
        return None
    fs, base = results.filesystem(root)
    paths = [f"{base}/tables/{name}/{trial_id}.parquet" for name in results.TABLES]
    if any(info.type != pafs.FileType.File for info in fs.get_file_info(paths)):
        return None
    return row


def finished_rows(root: str) -> list[dict[str, Any]]:
    """:func:`finished_row` of every trial under ``root``: one read of the trials table and one
    listing a table, not a look-up a trial (a resumed sweep of thousands)."""
    table = results.read_table(root, "trials")
    if table is None:
        return []
    complete = set.intersection(*(results.written_trials(root, name) for name in results.TABLES))
    return [row for row in table.to_pylist()
            if row["status"] in RECORDED_ENDS and row["trial_id"] in complete]


def _metrics(values: dict[str, Any], objective: str | None, shown: bool) -> dict[str, Any]:
    """What a trial reports to Tune: its round and the objective when it has one, and every
    number of the record when something shows them (``shown``: ``--log`` trackers, Tune's
    progress table under ``--verbose``). Tune keeps running statistics of every number a trial
    reports in the experiment state it rewrites as trials end, 15 KB a trial for a record's 21
    numbers, and nothing else reads them: the tables hold every round. (Tune sets its own
    ``trial_id`` in every result: the record's would be overwritten.)"""
    report = _scalars(values) if shown else {"round": values["round"]}
    if objective is not None:
        value = objective_value(values, objective)
        if value is not None:
            report[objective] = value
    return report


@dataclass
class ReportGate:
    """Which rounds a trial sends Tune. Each report waits for the driver to take it (Tune's
    function runner blocks until then), and the driver's loggers and console work on each: on
    tiny rounds that costs more than the round. So a round goes when something acts on it: it
    carries the objective (ASHA, a searcher), a checkpoint, a divergence or the trial's end, or
    it evaluates while ``evaluations`` says something shows every evaluation (``--log``
    trackers, Tune's own progress table under ``--verbose``); any other round only
    ``min_s`` after the previous report. The tables get every round whatever goes to Tune."""

    min_s: float
    evaluations: bool
    last: float = -math.inf  # monotonic time of the last report

    def due(self, record: dict[str, Any], report: dict[str, Any], objective: str | None, *,
            final: bool, diverged: bool, checkpointed: bool, now: float) -> bool:
        due = (checkpointed or final or diverged or objective in report
               or (self.evaluations and evaluates(record)) or now - self.last >= self.min_s)
        if due:
            self.last = now
        return due


class GroupFailed(RuntimeError):
    """Trials of a group that failed in this attempt, each recorded in its tables: Tune retries
    the group (``max_failures``), whose next attempt runs only the trials without an end."""


MEMBER = "raylf_trial"  # the key that names a group's trial in its reports to Tune
ENDED = "trials_ended"  # a group's trials whose tables recorded their end since its last report


@dataclass
class GroupReports:
    """What a group's trials send Tune, together: one ``ReportGate`` for the whole group (a
    trial's own gate would send its first round, a wait for the driver per trial) and the trials
    that ended since the last report, which go with the next report the gate lets through, or
    with the group's end (the console prints their lines then)."""

    gate: ReportGate
    ended: list[str]

    def with_ended(self, report: dict[str, Any]) -> dict[str, Any]:
        if self.ended:
            report = report | {ENDED: list(self.ended)}
            self.ended.clear()
        return report


def run_trial(config: dict[str, Any], *, stage: SharedStage, checkpoint_every: int,
              checkpoint_min_s: float, report_min_s: float, shown: bool,
              keep_final_states: tuple[str, ...]) -> None:
    """Tune function trial: the experiment its config stands for, or each of its group's in
    turn (``GridStage.groups``).

    A group's trial that fails is recorded (its tables) and reported, the group's other trials
    still run, and the attempt then fails (``GroupFailed``): Tune retries the group as it would
    a trial (``max_failures``), and each attempt runs only the trials without an end, so every
    trial gets the retries it would get alone, and a group left with a trial that failed for
    good ends in error, which a resumed sweep retries. (A round past its timeout leaves its call
    running on its thread: the later trials run on a new one, ``process_caller``, and Tune ends
    the process with the failed attempt.)"""
    stage = stage.get()
    members = stage.members(config)
    tune_dir = f"{stage.path}/{stage.trial_id(config)}"  # Tune's folder (run_stage names it)
    settings = {"checkpoint_every": checkpoint_every, "checkpoint_min_s": checkpoint_min_s,
                "shown": shown, "keep_final_states": keep_final_states}
    if len(members) == 1:
        run_member(members[0], _read(stage.root, members[0].trial_id), stage, tune_dir,
                   ReportGate(report_min_s, shown), None, **settings)
        return
    group = GroupReports(ReportGate(report_min_s, shown), [])
    failed = []
    for trial in members:
        try:
            run_member(trial, _read(stage.root, trial.trial_id), stage, tune_dir, group.gate,
                       group, **settings)
        except StorageUnwritable:
            raise  # every later trial would fail the same way
        except Exception as err:  # its trials row holds the traceback
            failed.append(trial.trial_id)
            tune.report(group.with_ended({"round": 0, MEMBER: trial.trial_id,
                                          "trial_failed": f"{type(err).__name__}: {err}"[-500:]}))
    if failed:
        raise GroupFailed(f"{len(failed)} of the group's {len(members)} trials failed: "
                          f"{', '.join(failed)} (each trial's error is in its trials row)")
    if group.ended:
        tune.report(group.with_ended({"round": 0}))


def _read(root: str, trial_id: str) -> dict[str, Any] | None:
    try:
        return results.read_trial(root, trial_id)
    except OSError as err:
        raise StorageUnwritable(f"cannot read {root}: {err}") from None


def run_member(trial, last: dict[str, Any] | None, stage, tune_dir: str, gate: ReportGate,
               group: GroupReports | None, *, checkpoint_every: int, checkpoint_min_s: float,
               shown: bool, keep_final_states: tuple[str, ...]) -> None:
    """One experiment of a Tune trial (``last``: its trials row as it was), resumed from
    Tune's checkpoint when that is this trial's; its checkpoints dropped once its tables record
    its end (the final personal states kept for the methods in ``keep_final_states``); its
    rounds reported to Tune as ``gate`` says, every number of each when something shows them
    (``shown``, ``_metrics``), each report naming the trial and the trials that ended before it
    in a ``group``.
    A trial of one worker trains in this process (``raylf.sweep.placement.trains_inline``), others
    on actors in the trial's placement group."""
    from raylf.experiment import RecordedStop, run_experiment
    from raylf.run import enforce_time_budget

    spec, trial_id, root = trial.spec, trial.trial_id, stage.root
    keep = spec.method.name in keep_final_states
    inline = trains_inline(spec)
    backend = "inline" if inline else "ray"
    tag = {} if group is None else {MEMBER: trial_id}
    try:
        finished = finished_row(root, trial_id, last)
        if finished is not None:
            checkpoints.drop_resume_state(root, trial_id, tune_dir, keep)
        else:
            attempts = announce(root, trial, stage, backend, last)
    except OSError as err:
        raise StorageUnwritable(f"cannot write to {root}: {err}") from None
    if finished is not None:
        # Tune may not have persisted this trial's end before the driver died: its tables say
        # it finished, so report that and do not run it again (what that run had not dropped
        # yet is dropped above).
        if group is None:
            tune.report(_ended_report(finished, stage.objective, shown))
        else:
            group.ended.append(trial_id)
        return
    progress, snapshot = _restored(tune.get_checkpoint(), None if group is None else trial_id)
    metrics = TrialMetrics(stage.sweep, trial_id, spec.method.name)
    tune_trial = tune.get_context().get_trial_id()

    def on_round(outcome, runtime, prog, snapshot):
        report = _metrics(outcome.record, stage.objective, shown) | tag
        metrics.record(outcome.record)
        final = prog.next_round > spec.federation.rounds
        # a group's trial: its end goes with a later report, once its tables are written
        due = gate.due(outcome.record, report, stage.objective, final=final and group is None,
                       diverged=outcome.diverged, checkpointed=snapshot is not None,
                       now=time.monotonic())
        if due and group is not None:
            report = group.with_ended(report)
        if due and snapshot is None:
            tune.report(report)
        elif due:
            with tempfile.TemporaryDirectory() as folder:
                state = {"trial_id": trial_id, "next_round": prog.next_round,
                         "rounds": prog.rounds, "clients": prog.clients, "wall_s": prog.wall_s}
                (Path(folder) / "progress.json").write_text(json.dumps(state))
                torch.save(snapshot, Path(folder) / "state.pt")
                tune.report(report, checkpoint=tune.Checkpoint.from_directory(folder))
        enforce_time_budget(spec, prog)
        stop = stage.scheduled and not final and stop_mark(stage.path, tune_trial)
        if stop and outcome.record["round"] >= stop["round"]:
            value = "-" if stop["value"] is None else format(stop["value"], ".4f")
            raise RecordedStop("stopped", (
                f"stopped by ASHA after round {stop['round']}: {stage.objective} {value} was "
                f"below its rung's cutoff ({spec.federation.rounds - stop['round']} rounds "
                "saved)"))

    placement = None if inline else (ray.util.get_current_placement_group(), 1)
    try:
        result = run_experiment(
            spec, backend=backend, out=root, trial_id=trial_id,
            sweep=stage.sweep, placement=placement, on_round=on_round,
            checkpoint_every=checkpoint_every, checkpoint_min_s=checkpoint_min_s,
            checkpoint_last=keep, progress=progress, snapshot=snapshot, reraise=True,
            extra={"attempts": attempts, **stage.extra})
        if result.status in RECORDED_ENDS:  # the tables it just wrote record an end for good
            checkpoints.drop_resume_state(root, trial_id, tune_dir, keep)
    except TimeoutError:
        raise  # a round past resources.round_timeout_s (an OSError too): not the storage
    except OSError as err:
        raise StorageUnwritable(f"cannot write to {root}: {err}") from None
    if group is not None:
        group.ended.append(trial_id)


def _ended_report(row: dict[str, Any], objective: str | None, shown: bool) -> dict[str, Any]:
    """What goes to Tune for a trial whose trials row records its end."""
    return _metrics({"round": row["rounds"], **{
        k: v for k, v in row.items() if k.startswith(("acc_", "val_"))}}, objective, shown)


def _restored(checkpoint, trial_id: str | None) -> tuple[Any, Any]:
    """Progress and state to resume from: Tune's checkpoint of this Tune trial, if it is this
    trial's (``trial_id``; None: a Tune trial of one trial, whose checkpoints are all its own)
    and still holds its payload (a group's trial that ended dropped it)."""
    from raylf.experiment import Progress

    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            path = Path(folder) / "progress.json"
            state = json.loads(path.read_text()) if path.exists() else {}
            owner = state.pop("trial_id", None)
            if state and (trial_id is None or owner == trial_id):
                return Progress(**state), torch.load(Path(folder) / "state.pt",
                                                     weights_only=True)
    return Progress(), None


def announce(root: str, trial, stage, backend: str, last: dict[str, Any] | None) -> int:
    """Write the trial's trials row as ``started`` before this attempt does anything, and
    return the attempt's number: one more than the row it replaces says (``last``: a failed
    attempt's row, or the ``started`` row of one whose process or driver was killed). The row
    this attempt writes at its end replaces it in turn, so a trial's three tables are its only
    objects in the storage, and the trials table shows which trials are running (or were, when
    a sweep was killed). The counting needs no listing: attempts of one trial never overlap
    (Tune runs a trial's next attempt once the last one ended)."""
    from raylf.experiment import Progress, trial_row

    attempts = int((last or {}).get("attempts") or 0) + 1
    row = trial_row(trial.spec, trial.trial_id, stage.sweep, backend, results.STARTED,
                    f"attempt {attempts} started and has recorded no end: it is running, or its "
                    "process or the sweep's driver was stopped (the next run of the sweep starts "
                    "it again)", None, Progress(), 0.0)
    results.write_trial(root, trial.trial_id, {"trials": [row | {"attempts": attempts,
                                                                  **stage.extra}]},
                        trial.spec.resolved())
    return attempts
