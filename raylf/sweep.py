"""``python -m raylf.sweep SPEC.yaml``: a grid of experiments × seeds on Ray Tune, or a search
on validation data followed by the chosen points × seeds (``raylf.search_stages``).

Each trial is a Tune function trial that reserves one placement-group bundle for itself, one for
the coordinator and one per client worker; it reports every round, checkpoints every
``checkpoint_every`` rounds (at most once per ``checkpoint_min_s``), and writes its own rows of
the Arrow tables under ``<storage>/<name>/tables/``; once they record its end, it drops its
checkpoints (``raylf.checkpoints``). A sweep directory that already exists is resumed (finished
trials are kept, unfinished ones continue from their last checkpoint).

The console shows the plan, one line per finished trial and a progress line with an ETA, then
the leaderboard; ``--verbose`` shows Tune's own tables instead.

Exit codes: 0 every trial finished (ok, diverged, timeout or stopped by ASHA), 1 some trial
failed after its retries or the storage stopped accepting writes, 2 invalid sweep spec, data or
resources the cluster can never provide (nothing ran), 130 interrupted (run it again to resume).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import ray
import torch
from ray import tune

from raylf import checkpoints, metrics, results, storage
from raylf.config import ExperimentSpec, SpecError
from raylf.estimate import ESTIMATE_ROUNDS
from raylf.leaderboard import leaderboard, render
from raylf.raycluster import Capacity, local_totals
from raylf.recipes import cluster_recipe
from raylf.runtime.ray_backend import bundles
from raylf.search import objective_value, stop_mark
from raylf.search_stages import (
    TRACKERS,
    GridStage,
    describe_search,
    search_then_replicate,
    sweep_identity,
    tracker_callbacks,
)
from raylf.smoke import SMOKE_ROUNDS
from raylf.sweepspec import (
    DataCheck,
    SweepSpec,
    Trial,
    check_runnable,
    load_sweep,
    search_plans,
)

TRIAL_CPUS = 0.25  # bundle 0: the trial function, which only drives rounds and writes tables
EXIT_FAILED, EXIT_SPEC, EXIT_INTERRUPTED = 1, 2, 130
RECORDED_ENDS = ("ok", "diverged", "timeout", "stopped")  # never run again once ended so


class StorageUnwritable(RuntimeError):
    """The sweep's storage stopped accepting writes: every further trial would fail the same."""


class Interrupted(RuntimeError):
    """Tune returned before every trial of a stage ended (Ctrl-C): nothing after it may run."""


def default_storage() -> str:
    return str(Path("~/raylf_results").expanduser().resolve())


def trial_bundles(spec: ExperimentSpec) -> list[dict[str, float]]:
    workers = min(spec.resources.workers, spec.federation.num_clients)
    return [{"CPU": TRIAL_CPUS}] + bundles(spec.resources, workers)


def _needs(spec: ExperimentSpec) -> dict[str, float]:
    need: dict[str, float] = {}
    for bundle in trial_bundles(spec):
        for kind, amount in bundle.items():
            need[kind] = need.get(kind, 0) + amount
    return need


def concurrent_fit(trials: list[Trial], total: dict[str, float]) -> int:
    """How many of the largest trial fit in the cluster's totals at once (0 = never)."""
    worst = max((_needs(t.spec) for t in trials), key=lambda n: sorted(n.items()))
    return min(int(total.get(kind, 0) // amount + 1e-9) for kind, amount in worst.items())


def check_plan(trials: list[Trial], total: dict[str, float]) -> None:
    """Every trial's bundles fit the cluster's totals (Tune would leave it pending forever)."""
    problems = set()
    for trial in trials:
        for kind, amount in _needs(trial.spec).items():
            if amount > total.get(kind, 0) + 1e-9:
                field = "resources.gpus_per_worker" if kind == "GPU" else "resources"
                fix = ("set resources.gpus_per_worker=0 to train on CPUs, or declare GPUs "
                       "(--num-gpus N, ray start --num-gpus N)" if kind == "GPU" and
                       not total.get("GPU") else
                       "lower resources.workers or the per-worker resources, or use a larger "
                       "cluster")
                problems.add((field, (
                    f"one trial needs {amount:g} {kind} ({trial_bundles(trial.spec)}), the Ray "
                    f"cluster has {total.get(kind, 0):g}; {fix}")))
    if problems:
        raise SpecError(sorted(problems))


def _resources(total: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(total.items()) if k in ("CPU", "GPU"))


def describe_plan(sweep: SweepSpec, trials: list[Trial], cluster: Capacity,
                  where: str, listing: bool = True) -> list[str]:
    """The plan: trial count (and, with ``listing``, every trial), bundles and how many fit."""
    points = len({(t.spec.method.name, json.dumps(t.point, sort_keys=True)) for t in trials})
    lines = [f"{len(trials)} trials" if listing else
             f"sweep {sweep.name}: {len(trials)} trials ({points} method/grid points × "
             f"{len(sweep.seeds)} seed{'' if len(sweep.seeds) == 1 else 's'})"]
    if listing:
        lines += [f"  {t.trial_id}  {t.label}" for t in trials]
    return lines + resource_lines(sweep, trials, cluster, where)


def resource_lines(sweep: SweepSpec, trials: list[Trial], cluster: Capacity,
                   where: str) -> list[str]:
    """Bundles per trial and how many of the largest fit the cluster at once (on an autoscaling
    cluster: once it has grown)."""
    cap = sweep.max_concurrent
    if cluster.most is None:
        fit = "an autoscaler adds nodes while trials wait for them"
    else:
        grows = f", up to {_resources(cluster.most)} by autoscaling" if cluster.autoscaling else ""
        fit = f"{concurrent_fit(trials, cluster.most)} trial(s) fit at once{grows}"
    return [f"bundles per trial: {trial_bundles(trials[0].spec)} (trial function, "
            "coordinator, one per client worker)",
            f"cluster ({where}): {_resources(cluster.now) or 'no resources'}; {fit}" +
            (f", capped at {cap} by max_concurrent" if cap else "")]


# ---- the Tune trial ---------------------------------------------------------------------------

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


def finished_row(root: str, trial_id: str) -> dict[str, Any] | None:
    """The trial's trials-table row if it ended for good and all three of its tables exist."""
    import pyarrow.fs as pafs

    row = results.read_trial(root, trial_id)
    if row is None or row["status"] not in RECORDED_ENDS:
        return None
    fs, base = results.filesystem(root)
    paths = [f"{base}/tables/{name}/{trial_id}.parquet" for name in results.TABLES]
    if any(info.type != pafs.FileType.File for info in fs.get_file_info(paths)):
        return None
    return row


def _metrics(values: dict[str, Any], objective: str | None) -> dict[str, Any]:
    """What a trial reports to Tune: the record's numbers, and the objective when it has one."""
    report = _scalars(values)
    if objective is not None:
        value = objective_value(values, objective)
        if value is not None:
            report[objective] = value
    return report


def run_trial(config: dict[str, Any], *, stage, checkpoint_every: int, checkpoint_min_s: float,
              keep_final_states: tuple[str, ...]) -> None:
    """Tune function trial: one experiment, resumed from Tune's checkpoint when there is one;
    its checkpoints dropped once its tables record its end (the final personal states kept for
    the methods in ``keep_final_states``)."""
    from raylf.experiment import Progress, RecordedStop, run_experiment
    from raylf.run import enforce_time_budget

    trial = stage.trial(config)
    spec, trial_id, root = trial.spec, trial.trial_id, stage.root
    keep = spec.method.name in keep_final_states
    tune_dir = f"{stage.path}/{trial_id}"  # Tune's folder of the trial (run_stage names it)
    finished = finished_row(root, trial_id)
    try:
        if finished is not None:
            checkpoints.drop_resume_state(root, trial_id, tune_dir, keep)
        else:
            attempts = _mark_attempt(root, trial_id)
    except OSError as err:
        raise StorageUnwritable(f"cannot write to {root}: {err}") from None
    if finished is not None:
        # Tune may not have persisted this trial's end before the driver died: its tables say
        # it finished, so report that and do not run it again (what that run had not dropped
        # yet is dropped above).
        tune.report({"trial_id": trial_id, "round": finished["rounds"], **_metrics(
            {k: v for k, v in finished.items() if k.startswith(("acc_", "val_"))},
            stage.objective)})
        return
    progress, snapshot = Progress(), None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            progress = Progress(**json.loads((Path(folder) / "progress.json").read_text()))
            snapshot = torch.load(Path(folder) / "state.pt", weights_only=True)
    metrics = TrialMetrics(stage.sweep, trial_id, spec.method.name)
    tune_trial = tune.get_context().get_trial_id()
    last_saved = -math.inf

    def on_round(outcome, runtime, prog, snapshot):
        nonlocal last_saved
        report = {"trial_id": trial_id, **_metrics(outcome.record, stage.objective)}
        metrics.record(outcome.record)
        final = prog.next_round > spec.federation.rounds  # a final snapshot: the kept final states
        if snapshot is None or (not final and time.monotonic() - last_saved < checkpoint_min_s):
            tune.report(report)
        else:
            with tempfile.TemporaryDirectory() as folder:
                state = {"next_round": prog.next_round, "rounds": prog.rounds,
                         "clients": prog.clients, "wall_s": prog.wall_s}
                (Path(folder) / "progress.json").write_text(json.dumps(state))
                torch.save(snapshot, Path(folder) / "state.pt")
                tune.report(report, checkpoint=tune.Checkpoint.from_directory(folder))
            last_saved = time.monotonic()
        enforce_time_budget(spec, prog)
        stop = stage.scheduled and not final and stop_mark(stage.path, tune_trial)
        if stop and outcome.record["round"] >= stop["round"]:
            value = "-" if stop["value"] is None else format(stop["value"], ".4f")
            raise RecordedStop("stopped", (
                f"stopped by ASHA after round {stop['round']}: {stage.objective} {value} was "
                f"below its rung's cutoff ({spec.federation.rounds - stop['round']} rounds "
                "saved)"))

    placement = (ray.util.get_current_placement_group(), 1)
    try:
        run_experiment(spec, backend="ray", out=root, trial_id=trial_id, sweep=stage.sweep,
                       placement=placement, on_round=on_round, checkpoint_every=checkpoint_every,
                       checkpoint_last=keep, progress=progress, snapshot=snapshot,
                       reraise=True, extra={"attempts": attempts, **stage.extra})
        if finished_row(root, trial_id) is not None:  # its tables record an end for good
            checkpoints.drop_resume_state(root, trial_id, tune_dir, keep)
    except OSError as err:
        raise StorageUnwritable(f"cannot write to {root}: {err}") from None


def _mark_attempt(root: str, trial_id: str) -> int:
    """Leave one marker per start of a trial; the count is the trials table's ``attempts``."""
    import pyarrow.fs as pafs

    fs, base = results.filesystem(root)
    folder = f"{base}/attempts/{trial_id}"
    fs.create_dir(folder, recursive=True)
    with fs.open_output_stream(f"{folder}/{uuid.uuid4().hex}"):
        pass
    return len(fs.get_file_info(pafs.FileSelector(folder)))


# ---- the console ------------------------------------------------------------------------------

def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _last_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


class SweepConsole(tune.Callback):
    """What the sweep prints while Tune runs: a line per finished trial and the progress.

    On a terminal the progress (done / running / pending, ETA) is one line kept at the bottom
    and status words are coloured; in a log each finished trial's line carries the progress,
    and there are no escape codes. The ETA extrapolates the rounds finished so far.
    """

    COLOURS = {"ok": "32", "diverged": "33", "timeout": "33", "stopped": "33", "failed": "31",
               "retry": "33"}

    def __init__(self, stage, stream=None):
        self.stage = stage
        self.root = stage.root
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.known: dict[str, Trial] = {}  # Tune's trial id → the trial its config stands for
        self.rounds: dict[str, int] = {}
        self.total_rounds = stage.rounds or 1
        self.done: set[str] = set()
        self.running: set[str] = set()
        self.started = time.monotonic()
        self.rounds_at_start: int | None = None
        self.width = stage.width
        self.storage_error: StorageUnwritable | None = None

    def __reduce__(self):
        # Tune pickles its run config, callbacks included, to restore a sweep later; a console
        # belongs to one process's terminal, so it unpickles as the restoring process's console.
        return (active_console, ())

    def _trial(self, tune_trial) -> Trial:
        if tune_trial.trial_id not in self.known:
            self.known[tune_trial.trial_id] = self.stage.trial(tune_trial.config)
        return self.known[tune_trial.trial_id]

    # Tune callback hooks
    def on_trial_start(self, iteration, trials, trial, **info):
        self.running.add(self._trial(trial).trial_id)
        self._progress()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.rounds[self._trial(trial).trial_id] = int(result.get("round", 0))
        self._progress()

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._finished(self._trial(trial), None)

    def on_trial_recover(self, iteration, trials, trial, **info):
        reason = _last_line(storage.trial_error(trial)) or (
            "Tune reported no error: the trial's process or its node was lost")
        self._line("retry", self._trial(trial), f"attempt failed: {reason}")

    def on_trial_error(self, iteration, trials, trial, **info):
        try:
            probe_storage(self.root)
        except OSError as err:  # every further trial would fail the same way: stop here
            self.storage_error = StorageUnwritable(f"cannot write to {self.root}: {err}")
            raise self.storage_error from None
        self._finished(self._trial(trial), _last_line(storage.trial_error(trial)))

    def start(self, already_done: dict[str, int]) -> None:
        """``already_done``: trial id → rounds of the trials a resumed stage keeps."""
        self.done.update(already_done)
        self.rounds.update(already_done)
        if already_done:
            self._print(f"resuming: {len(already_done)} of {self.stage.planned} trials already "
                        "finished")
        self.rounds_at_start = sum(self.rounds.values())

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()

    # rendering
    def _finished(self, trial: Trial, tune_error: str | None) -> None:
        trial_id = trial.trial_id
        self.done.add(trial_id)
        self.running.discard(trial_id)
        self.rounds[trial_id] = trial.spec.federation.rounds
        row = results.read_trial(self.root, trial_id) or {}
        status = row.get("status") or "failed"
        if status == "ok" and self.stage.objective is not None:  # a search trial: validation
            value = objective_value(row, self.stage.objective)
            detail = f"{self.stage.objective} {'-' if value is None else format(value, '.4f')}"
        elif status == "ok":  # final mean and worst accuracy of the reported model (per task
            # for multi-task methods; a second deployable's are in the tables, not on the line)
            keys = [k for kind in ("acc_mean", "acc_worst") for k in metrics.of_reported_model(
                [k for k in row if (k == kind or k.startswith(kind + "_")) and "_at_" not in k
                 and row[k] is not None])]
            detail = "  ".join(f"{k} {'-' if row.get(k) is None else format(row[k], '.4f')}"
                               for k in keys)
        else:
            detail = _last_line(row.get("error")) or tune_error or "no tables written"
        seconds = f"  {row['wall_s']:.1f}s" if row.get("wall_s") is not None else ""
        warning = f"  warning: {row['warning']}" if row.get("warning") else ""
        self._line(status, trial, f"{detail}{seconds}{warning}")

    def _line(self, status: str, trial: Trial, detail: str) -> None:
        word = f"{status:<8}"
        if self.tty:
            word = f"\033[{self.COLOURS.get(status, '0')}m{word}\033[0m"
        planned = self.stage.planned
        self.width = max(self.width, len(trial.label))
        count = f"[{len(self.done):>{len(str(planned))}}/{planned}]"
        text = f"{count} {word} {trial.label:<{self.width}}  {detail}"
        if not self.tty:
            text += f"  ({self._status()})"
        self._print(text)

    def _status(self) -> str:
        pending = max(0, self.stage.planned - len(self.done) - len(self.running))
        parts = [f"done {len(self.done)}/{self.stage.planned}", f"running {len(self.running)}",
                 f"pending {pending}"]
        eta = self._eta()
        if eta is not None:
            parts.append(f"ETA {_duration(eta)}")
        return ", ".join(parts)

    def _eta(self) -> float | None:
        done = sum(self.rounds.values())
        gained = done - (self.rounds_at_start or 0)
        if gained <= 0 or done >= self.total_rounds:
            return None
        return (time.monotonic() - self.started) * (self.total_rounds - done) / gained

    def _print(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + text + "\n")
            self._progress()
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def _progress(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + self._status())
            self.stream.flush()


_consoles: list[SweepConsole] = []  # the console of the sweep this process is running


def active_console() -> tune.Callback:
    return _consoles[-1] if _consoles else tune.Callback()


# ---- the driver -------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m raylf.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", nargs="+", help="sweep spec (YAML); several only with --smoke "
                        "or --dry-run")
    parser.add_argument("--storage", default=None,
                        help=f"results root: a path or s3://… (default {default_storage()})")
    parser.add_argument("--name", help="sweep name (default: the spec's name)")
    parser.add_argument("--resume", action="store_true",
                        help="require an existing sweep to resume (it resumes anyway if present)")
    parser.add_argument("--max-concurrent", type=int, help="trials in flight at once")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the trials, the resource plan and the data still to fetch; "
                             "run nothing (works before the data are downloaded)")
    parser.add_argument("--smoke", action="store_true",
                        help="run every distinct configuration once (one seed, --smoke-rounds "
                             "rounds, resources shrunk to this machine, stand-in data where a "
                             "dataset is not fetched) into <name>-smoke; results are no results")
    parser.add_argument("--smoke-rounds", type=int, default=SMOKE_ROUNDS, metavar="N",
                        help=f"rounds of each smoke trial (default {SMOKE_ROUNDS})")
    parser.add_argument("--smoke-paths", action="store_true",
                        help="smoke-run one configuration per code path (a method with its "
                             "non-numeric parameters × model × dataset) instead of every one")
    parser.add_argument("--estimate", action="store_true",
                        help="time --estimate-rounds rounds of every distinct configuration "
                             "here (or on the cluster joined) and print trial times, "
                             "device-hours and wall time; runs into <name>-estimate")
    parser.add_argument("--estimate-rounds", type=int, default=ESTIMATE_ROUNDS, metavar="N",
                        help=f"rounds timed per configuration (default {ESTIMATE_ROUNDS})")
    parser.add_argument("--estimate-budget", type=int, metavar="N",
                        help="time at most N configurations: those differing only in their "
                             "scenario (then also dataset) share one timing trial (default: "
                             "time every distinct configuration)")
    parser.add_argument("--cluster", metavar="RECIPE",
                        help="also plan against a cluster recipe's largest size (cluster/*.yaml: "
                             "a Ray cluster launcher file or a KubeRay RayCluster)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a sweep field or a base experiment "
                        "field, e.g. seeds=[0,1] or federation.rounds=5")
    parser.add_argument("--address", help="Ray cluster to join (default $RAY_ADDRESS, else local)")
    parser.add_argument("--num-cpus", type=int, help="CPUs of a locally started Ray")
    parser.add_argument("--num-gpus", type=float, help="logical GPUs of a locally started Ray")
    parser.add_argument("--verbose", action="store_true",
                        help="Tune's own progress tables and Ray's info logs instead of the "
                             "one-line-per-trial console")
    parser.add_argument("--log", action="append", default=[], choices=sorted(TRACKERS),
                        help="also log every trial to TensorBoard, MLflow or W&B through "
                             "Tune's callbacks (offline, under the sweep directory; repeatable)")
    parser.add_argument("--dashboard", action="store_true",
                        help="start the local Ray with its dashboard on 127.0.0.1 and print "
                             "its URL")
    return parser.parse_args(argv)


def probe_storage(root: str) -> None:
    """Create the sweep directory and write (and remove) a file in it; OSError if it cannot."""
    fs, base = results.filesystem(root)
    probe = f"{base}/.raylf-write-probe-{uuid.uuid4().hex}"
    fs.create_dir(base, recursive=True)
    with fs.open_output_stream(probe) as f:
        f.write(b"ok")
    fs.delete_file(probe)


def check_storage(root: str) -> None:
    """The sweep directory can be written, before anything starts."""
    try:
        probe_storage(root)
    except OSError as err:
        raise SpecError([("--storage", (
            f"cannot write to {root}: {err}; choose a writable --storage (a directory you own, "
            "or an s3:// bucket your credentials may put and delete objects in; for an "
            "endpoint other than AWS set AWS_ENDPOINT_URL)"))]) from None


@dataclass
class Loaded:
    """What the driver runs: the sweep, its trials (and search plans and probes); for a smoke or
    estimate run the derived sweep and ``mode``'s trials, the spec's own kept in ``original``."""

    sweep: SweepSpec
    trials: list[Trial]
    plans: list
    probes: list[Trial]
    mode: Any = None  # SmokePlan | EstimatePlan
    original: tuple | None = None  # (sweep, trials, plans, probes) the mode was derived from


def load_specs(args: argparse.Namespace, overrides: list[str]) -> Loaded:
    """One spec as it is; with ``--smoke`` / ``--estimate`` every distinct configuration of
    every spec given, shrunk (raylf.smoke) or cut to a few timed rounds (raylf.estimate)."""
    if args.smoke and args.estimate:
        raise SpecError([("--estimate", "give --smoke or --estimate, not both")])
    if args.estimate_budget is not None and not args.estimate:
        raise SpecError([("--estimate-budget", "it sets how many trials --estimate times: "
                                               "give --estimate with it")])
    if len(args.spec) > 1 and not (args.smoke or args.dry_run):
        raise SpecError([("spec", f"{len(args.spec)} spec files given; several are planned or "
                                  "smoke-run together (--dry-run, --smoke), one is run")])
    loaded = []
    for path in args.spec:
        sweep, trials = load_sweep(path, overrides)
        plans, probes = search_plans(sweep, Path(path).parent, path) if sweep.searched \
            else ([], [])
        loaded.append((sweep, trials, plans, probes))
    everything = [t for one in loaded for t in one[1] + one[3]]
    if args.smoke:
        from raylf import smoke

        if args.smoke_rounds < 1:
            raise SpecError([("--smoke-rounds", "give at least 1 round")])
        # a searched method is smoke-run at its probes: every end of its space, every choice
        mode = smoke.plan(everything, args.smoke_rounds, paths=args.smoke_paths)
        name = args.name or (f"{loaded[0][0].name}-smoke" if len(loaded) == 1 else "smoke")
    elif args.estimate:
        from raylf import estimate

        if args.estimate_rounds < 1:
            raise SpecError([("--estimate-rounds", "give at least 1 round")])
        if args.estimate_budget is not None and args.estimate_budget < 1:
            raise SpecError([("--estimate-budget", "give at least 1 timing trial")])
        mode = estimate.plan(everything, args.estimate_rounds, args.estimate_budget,
                             standins=not args.dry_run)
        name = args.name or f"{loaded[0][0].name}-estimate"
    elif len(loaded) == 1:
        return Loaded(*loaded[0])
    else:
        return Loaded(loaded[0][0], everything, [], [])
    # an estimate times its trials as many at once as the sweep would run them: on a machine
    # they share, neighbours slow a trial down, and that is part of what is estimated
    derived = SweepSpec(name=name, experiment={}, seeds=[0], max_failures=0,
                        max_concurrent=args.max_concurrent or (loaded[0][0].max_concurrent
                                                               if args.estimate else None))
    return Loaded(derived, mode.trials, [], [], mode, loaded[0])


def _size(nbytes: float | None) -> str:
    return "size unpublished" if nbytes is None else f"{nbytes / 2**20:,.1f} MiB"


def to_fetch(name: str, root: str) -> str:
    """One dataset still to download: its files, their sizes and the command."""
    from raylf.data.manifest import load_manifest

    files = load_manifest(name).files
    sizes = [f.size for f in files]
    total = None if None in sizes else sum(sizes)
    return (f"to fetch: {name}, {_size(total)} ({', '.join(f.filename for f in files)}) into "
            f"{root}: python -m raylf.datasets fetch {name} --root {root}")


def missing_weights(specs: list[ExperimentSpec]) -> list[str]:
    """Pretrained weights the specs name that are not in torch's hub cache yet."""
    import torchvision.models as tvm

    from raylf.smoke import PRETRAINED, hub_file

    lines = []
    for model in sorted({s.model.name for s in specs
                         if getattr(s.model.params, "weights", None) == "imagenet"}):
        if model in PRETRAINED and not hub_file(model).is_file():
            weights = getattr(tvm, PRETRAINED[model]).IMAGENET1K_V1
            lines.append(f"to fetch: {model} ImageNet weights, "
                         f"{weights.meta['_file_size']:.1f} MB ({weights.url}) into "
                         f"{hub_file(model).parent} (torchvision downloads it on first use)")
    return lines


def data_notices(check: DataCheck, loaded: Loaded) -> list[str]:
    """What the console says before anything runs: datasets to fetch (a plan), loudly every
    dataset a run reads as stand-in content, and what a smoke or estimate run is."""
    lines = [to_fetch(name, root) for name, root in sorted(check.missing.items())]
    lines += missing_weights([t.spec for t in loaded.trials + loaded.probes])
    if check.standins():
        from raylf.data.standin import notice

        lines += [notice(name) for name in check.standins()]
    kind = type(loaded.mode).__name__
    if kind == "SmokePlan":
        lines.append(f"smoke: {len(loaded.trials)} distinct configuration(s), one seed each, "
                     "resources shrunk to one machine; these tables test that the specs run and "
                     "say nothing about accuracy")
    elif kind == "EstimatePlan":
        lines.append(f"estimate: timing {len(loaded.trials)} configuration(s) as many at once "
                     "as the sweep would run them, for at most "
                     f"{max(t.spec.federation.rounds for t in loaded.trials)} round(s) each")
    if loaded.mode is not None:
        lines += [f"{kind.removesuffix('Plan').lower()}: {line}" for line in loaded.mode.notes]
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = list(args.overrides)
    derived = args.smoke or args.estimate  # their sweep is derived from the spec's
    if args.name and not derived:
        overrides.append(f"name={args.name}")
    if args.max_concurrent is not None and not derived:
        overrides.append(f"max_concurrent={args.max_concurrent}")
    base = args.storage or default_storage()
    try:
        loaded = load_specs(args, overrides)
        sweep, trials, plans, probes = loaded.sweep, loaded.trials, loaded.plans, loaded.probes
        check = check_runnable([t.spec for t in trials + probes], missing_ok=args.dry_run)
        root = f"{base.rstrip('/')}/{sweep.name}"
        trackers = tracker_callbacks(args.log, root, sweep.name)
        identity = sweep_identity(sweep, trials, plans)
        if not args.dry_run:
            check_same_sweep(root, identity)
        if args.resume and not _claimed(root):
            raise SpecError([("--resume", f"no sweep to resume at {root}; run without --resume "
                                          "to start it")])
        recipe = cluster_recipe(args.cluster) if args.cluster else None
    except SpecError as err:
        print(err, file=sys.stderr)
        return EXIT_SPEC
    sizing = trials + probes  # every trial the sweep may run is like one of these
    wanted_gpus = max(t.spec.resources.gpus_per_worker for t in sizing)

    def describe(cluster: Capacity, where: str, listing: bool = True) -> list[str]:
        if not plans:
            return describe_plan(sweep, trials, cluster, where, listing)
        return describe_search(sweep, plans, trials) + resource_lines(sweep, sizing, cluster,
                                                                      where)

    notices = data_notices(check, loaded)
    address = args.address or os.environ.get("RAY_ADDRESS")
    local = None if address else local_totals(args.num_cpus, args.num_gpus, wanted_gpus)
    if args.dry_run:
        if address:
            from raylf.raycluster import capacity

            ray.init(address=address, logging_level="error")
            cluster, where = capacity(), f"connected to {address}"
        else:
            cluster, where = Capacity(local, local), "a local Ray would be started"
        lines = describe(cluster, where)
        if recipe is not None:
            lines += resource_lines(sweep, sizing, recipe.capacity, recipe.where)[1:]
        print("\n".join(lines + notices))
        print(f"tables would go to {root}/tables/")
        return 0
    from raylf.raycluster import capacity, connect

    if local is not None and not ray.is_initialized():
        try:  # a local Ray that could never host the plan is not started
            check_plan(sizing, local)
        except SpecError as err:
            print(err, file=sys.stderr)
            return EXIT_SPEC
    context = connect(args.address, args.num_gpus, wanted_gpus, num_cpus=args.num_cpus,
                      dashboard=args.dashboard, verbose=args.verbose)
    storage.one_line_storage_errors()
    cluster = capacity()
    try:
        if cluster.most is not None:  # else trials wait for the nodes an autoscaler adds
            check_plan(sizing, cluster.most)
        check_storage(root)  # after the plan: impossible resources leave no directory behind
    except SpecError as err:
        print(err, file=sys.stderr)
        return EXIT_SPEC
    where = f"joined {address}" if address else "local Ray"
    print("\n".join(describe(cluster, where, listing=False) + notices))
    if args.dashboard and context is not None and context.dashboard_url:
        print(f"dashboard: http://{context.dashboard_url}")
    print(f"tables: {root}/tables/", flush=True)
    claim(root, identity)
    fit = sweep.max_concurrent or max(1, len(sizing) if cluster.most is None else
                                      concurrent_fit(sizing, cluster.most))
    run = partial(run_stage, sweep=sweep, max_concurrent=fit, verbose=args.verbose,
                  trackers=trackers)
    started = time.perf_counter()
    try:
        if plans:
            trials, choices, failed = search_then_replicate(sweep, plans, trials, base, run)
        else:
            grid = run(GridStage(trials, sweep.name, base))
            choices, failed = {}, any(result.error is not None for result in grid)
    except SpecError as err:
        print(err, file=sys.stderr)
        return EXIT_SPEC
    except StorageUnwritable as err:
        return _stopped(err, root)
    except Interrupted as err:
        print(f"interrupted: {err}; run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    except RuntimeError as err:  # Tune gave up on its own actors (e.g. Ray's out-of-memory kill)
        cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"error: the sweep stopped: {cause[:400]}. The tables of finished trials are "
              f"intact under {root}/tables/; run the same command again to resume (with fewer "
              "trials at once, --max-concurrent, if memory ran out)", file=sys.stderr)
        return EXIT_FAILED
    if args.smoke:
        print(smoke_summary(root, trials))
        return EXIT_FAILED if failed else 0
    if args.estimate:
        print(estimate_summary(root, loaded, time.perf_counter() - started, cluster, where,
                               recipe))
        return EXIT_FAILED if failed else 0
    board = leaderboard(root, trials, choices)
    print(render(board))
    try:
        results.write_table(root, "leaderboard", "summary", results.to_table(
            board.to_dict("records"), results.provenance({"sweep": sweep.model_dump(mode="json")})))
        compacted = results.compact(root)  # one file per table, for readers without options
    except OSError as err:
        return _stopped(StorageUnwritable(f"cannot write to {root}: {err}"), root)
    print(f"tables: {root}/tables/{{{','.join((*results.TABLES, 'leaderboard'))}}}/  "
          f"load them with raylf.results.load({root!r})")
    if compacted:
        print(f"one file per table: {root}/{results.COMPACT}/tables/<table>/<table>.parquet "
              "(pandas, polars and duckdb read each as it is)")
    if plans:
        print(f"search tables (validation, never reported): {root}/search/tables/  "
              f"load them with raylf.results.load({root + '/search'!r})")
    if "tensorboard" in args.log:
        print(f"tensorboard: tensorboard --logdir {root}")
    try:
        from raylf.report import write_report  # matplotlib: only once the sweep is done

        written = write_report(root, formats=("md", "html"))
        print(f"report: {written['html']} (markdown: {written['md']}; again: "
              f"python -m raylf.report {root})")
    except Exception as err:  # the tables are safe; a report problem must not fail the sweep
        print(f"report: not written ({type(err).__name__}: {err}); "
              f"python -m raylf.report {root}", file=sys.stderr)
    return EXIT_FAILED if failed else 0


def estimate_summary(root: str, loaded: Loaded, stage_wall_s: float, cluster: Capacity,
                     where: str, recipe) -> str:
    """The estimate of the spec's sweep from the timing trials just run (raylf.estimate)."""
    from raylf import estimate

    sweep, trials, plans, probes = loaded.original
    sizing = trials + probes
    here = sweep.max_concurrent or (concurrent_fit(sizing, cluster.most) if cluster.most
                                    else len(sizing))
    timed_at = loaded.sweep.max_concurrent or min(here, len(loaded.trials))
    costs = estimate.costs(root, loaded.mode, trials, plans, probes, stage_wall_s, timed_at,
                           replicates=sweep.top_k * len(sweep.seeds))
    slots = [("at the spec's concurrency" if sweep.max_concurrent else f"on {where}", here)]
    if recipe is not None:
        slots.append((f"on {recipe.where}", concurrent_fit(sizing, recipe.most)))
    machine = f"{where} ({_resources(cluster.now)})"
    return estimate.render(costs, machine, slots) + (
        "\n(trial times are this machine's: on other hardware, run --estimate there, e.g. as a "
        "Ray job on the cluster)" if recipe is not None else "")


def smoke_summary(root: str, trials: list[Trial]) -> str:
    """How many configurations ran their smoke rounds, and the ones that did not, each with
    its reason (the tables hold the rest)."""
    table = results.read_table(root, "trials")
    rows = {r["trial_id"]: r for r in (table.to_pylist() if table is not None else [])}
    bad = [(t, rows.get(t.trial_id)) for t in trials
           if (rows.get(t.trial_id) or {}).get("status") != "ok"]
    lines = [f"smoke: {len(trials) - len(bad)} of {len(trials)} configuration(s) ran every "
             f"round ok (tables: {root}/tables/)"]
    for trial, row in bad:
        status = row["status"] if row else "no result"
        reason = _last_line(row.get("error")) if row else "the trial wrote no row"
        lines.append(f"  {status}: {trial.spec.name} {trial.label}: {reason}")
    return "\n".join(lines)


def _stopped(err: StorageUnwritable, root: str) -> int:
    print(f"error: the sweep stopped: {err}. The tables of finished trials are intact under "
          f"{root}/tables/; once the storage takes writes again (permissions, free space; for "
          "object storage the endpoint reachable and the credentials valid) run the same command "
          "again: the sweep resumes.", file=sys.stderr)
    return EXIT_FAILED


def already_finished(stage) -> dict[str, int]:
    """Trial id → rounds of the stage's trials whose tables say they ended for good."""
    table = results.read_table(stage.root, "trials")
    rows = table.to_pylist() if table is not None else []
    return {r["trial_id"]: r["federation.rounds"] for r in rows
            if stage.owns(r) and finished_row(stage.root, r["trial_id"]) is not None}


def run_stage(stage, *, sweep: SweepSpec, max_concurrent: int, verbose: bool = False,
              trackers: list[tune.Callback] = ()) -> tune.ResultGrid:
    """Run (or resume) one Tune experiment of the sweep.
    Tune's CSV and JSON results are kept; TensorBoard and the trackers only with ``--log``."""
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    console = SweepConsole(stage)
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, stage=stage, checkpoint_every=sweep.checkpoint_every,
                             checkpoint_min_s=sweep.checkpoint_min_s,
                             keep_final_states=tuple(sweep.keep_final_states)),
        lambda config: tune.PlacementGroupFactory(
            trial_bundles(stage.trial(config).spec), strategy="PACK"))
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"  # objectives: evaluation rounds only
    run_config = tune.RunConfig(
        name=stage.name, storage_path=stage.storage_path,
        failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=checkpoints.CHECKPOINTS_KEPT),
        callbacks=[CSVLoggerCallback(), JsonLoggerCallback(), *trackers,
                   *([] if verbose else [console])],
        verbose=None if verbose else 0)
    _consoles[:] = [] if verbose else [console]
    if not verbose:  # Tune's newer output engine prints its start block even at verbose=0
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    space, search = stage.tune_setup(max_concurrent)
    if tune.Tuner.can_restore(stage.path):
        # The space again: Tune does not keep it, and starts afresh from it when the driver died
        # after saving the tuner but before the first experiment state.
        tuner = tune.Tuner.restore(stage.path, trainable=trainable, param_space=space,
                                   resume_errored=True)
    else:
        tuner = tune.Tuner(
            trainable, param_space=space,
            tune_config=tune.TuneConfig(
                # A trial's process is kept for the next trial of the same resources: each new
                # one costs ~5 CPU-s of imports (torch, Tune, raylf), the bulk of a tiny trial.
                reuse_actors=True,
                trial_name_creator=lambda t: stage.trial(t.config).trial_id,
                # run_trial finds its Tune checkpoints in <stage.path>/<trial_id>
                trial_dirname_creator=lambda t: stage.trial(t.config).trial_id, **search),
            run_config=run_config)
    console.start(already_finished(stage))
    try:
        grid = tuner.fit()
    except tune.TuneError:  # how Tune passes on the console's StorageUnwritable
        if console.storage_error is None:
            raise
        raise console.storage_error from None
    finally:
        console.finish()
    if grid.num_terminated + grid.num_errors < stage.planned:
        raise Interrupted(f"{stage.planned - grid.num_terminated - grid.num_errors} trial(s) of "
                          f"{stage.path} did not end")
    return grid


def _sweep_marker(path: str):
    fs, base = results.filesystem(path)
    return fs, f"{base}/sweep.json"


def _claimed(path: str) -> bool:
    import pyarrow.fs as pafs

    fs, marker = _sweep_marker(path)
    return fs.get_file_info(marker).type == pafs.FileType.File


def check_same_sweep(path: str, identity: dict[str, Any]) -> None:
    """A sweep directory resumes only the sweep that created it (Tune's space is fixed)."""
    if not _claimed(path):
        return
    fs, marker = _sweep_marker(path)
    with fs.open_input_stream(marker) as f:
        before = json.loads(f.read())
    if before != identity:
        old, new = before.get("trial_ids", []), identity["trial_ids"]
        what = "searches" if before.get("searches") != identity.get("searches") else "trials"
        raise SpecError([("name", (
            f"{path} holds a different sweep ({len(old)} trials, "
            f"{len(set(old) - set(new))} of them not in this spec; its {what} differ); choose "
            "another --name or --storage, or remove that directory"))])


def claim(path: str, identity: dict[str, Any]) -> None:
    """Record which trials (and searches) this sweep directory holds (kept on resume)."""
    if _claimed(path):
        return
    fs, marker = _sweep_marker(path)
    with fs.open_output_stream(marker) as f:
        f.write(json.dumps(identity).encode())


if __name__ == "__main__":
    # through the module's import name: Tune pickles the trainable and the console by reference
    from raylf.sweep import main as sweep_main

    sys.exit(sweep_main())
