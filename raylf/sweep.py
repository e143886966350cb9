"""``python -m raylf.sweep SPEC.yaml``: a grid of experiments × seeds on Ray Tune.

Each trial is a Tune function trial that reserves one placement-group bundle for itself, one for
the coordinator and one per client worker; it reports every round, checkpoints every
``checkpoint_every`` rounds (at most once per ``checkpoint_min_s``), and writes its own rows of
the Arrow tables under ``<storage>/<name>/tables/``. A sweep directory that already exists is
resumed (finished trials are kept, unfinished ones continue from their last checkpoint).

The console shows the plan, one line per finished trial and a progress line with an ETA, then
the leaderboard; ``--verbose`` shows Tune's own tables instead.

Exit codes: 0 every trial finished (ok, diverged or timeout), 1 some trial failed after its
retries or the storage stopped accepting writes, 2 invalid sweep spec, data or resources the
cluster can never provide (nothing ran).
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
from pathlib import Path
from typing import Any

import torch
from ray import tune

from raylf import results
from raylf.config import ExperimentSpec, SpecError
from raylf.leaderboard import leaderboard, render
from raylf.runtime.ray_backend import bundles
from raylf.sweepspec import SweepSpec, Trial, check_runnable, load_sweep

TRIAL_CPUS = 0.25  # bundle 0: the trial function, which only drives rounds and writes tables
EXIT_FAILED, EXIT_SPEC = 1, 2
RECORDED_ENDS = ("ok", "diverged", "timeout")  # a trial that ended so is never run again
# Tune forces an experiment-state snapshot each time a trial has saved this many checkpoints
# since the last one; with checkpoint_min_s between checkpoints that stays rarer than Tune's
# own periodic snapshot.
CHECKPOINTS_KEPT = 3


class StorageUnwritable(RuntimeError):
    """The sweep's storage stopped accepting writes: every further trial would fail the same."""


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


def describe_plan(sweep: SweepSpec, trials: list[Trial], total: dict[str, float],
                  where: str, listing: bool = True) -> list[str]:
    """The plan: trial count (and, with ``listing``, every trial), bundles and how many fit."""
    fit = concurrent_fit(trials, total)
    cap = sweep.max_concurrent
    points = len({(t.spec.method.name, json.dumps(t.point, sort_keys=True)) for t in trials})
    lines = [f"{len(trials)} trials" if listing else
             f"sweep {sweep.name}: {len(trials)} trials ({points} method/grid points × "
             f"{len(sweep.seeds)} seeds)"]
    if listing:
        lines += [f"  {t.trial_id}  {t.label}" for t in trials]
    lines.append(f"bundles per trial: {trial_bundles(trials[0].spec)} (trial function, "
                 "coordinator, one per client worker)")
    lines.append(f"cluster ({where}): {_resources(total) or 'no resources'}; {fit} trial(s) fit "
                 "at once" + (f", capped at {cap} by max_concurrent" if cap else ""))
    return lines


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


def run_trial(config: dict[str, Any], *, specs: dict[str, dict], storage: str, sweep: str,
              checkpoint_every: int, checkpoint_min_s: float) -> None:
    """Tune function trial: one experiment, resumed from Tune's checkpoint when there is one."""
    import ray

    from raylf.config import validate
    from raylf.experiment import Progress, run_experiment
    from raylf.run import enforce_time_budget

    trial_id = config["trial_id"]
    spec = validate(specs[trial_id])
    root = f"{storage.rstrip('/')}/{sweep}"
    finished = finished_row(root, trial_id)
    if finished is not None:
        # Tune may not have persisted this trial's end before the driver died: its tables say
        # it finished, so report that and do not run it again.
        tune.report({"trial_id": trial_id, "round": finished["rounds"], **{
            k: v for k, v in finished.items() if k.startswith("acc_") and v is not None}})
        return
    try:
        attempts = _mark_attempt(root, trial_id)
    except OSError as err:
        raise StorageUnwritable(f"cannot write to {root}: {err}") from None
    progress, snapshot = Progress(), None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            progress = Progress(**json.loads((Path(folder) / "progress.json").read_text()))
            snapshot = torch.load(Path(folder) / "state.pt", weights_only=True)
    metrics = TrialMetrics(sweep, trial_id, spec.method.name)
    last_saved = -math.inf

    def on_round(outcome, runtime, prog, snapshot):
        nonlocal last_saved
        report = {"trial_id": trial_id, **_scalars(outcome.record)}
        metrics.record(outcome.record)
        final = prog.next_round > spec.federation.rounds
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

    placement = (ray.util.get_current_placement_group(), 1)
    try:
        run_experiment(spec, backend="ray", out=root, trial_id=trial_id, sweep=sweep,
                       placement=placement, on_round=on_round, checkpoint_every=checkpoint_every,
                       progress=progress, snapshot=snapshot,
                       reraise=True, extra={"attempts": attempts})
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

    COLOURS = {"ok": "32", "diverged": "33", "timeout": "33", "failed": "31", "retry": "33"}

    def __init__(self, trials: list[Trial], root: str, stream=None):
        self.trials = {t.trial_id: t for t in trials}
        self.root = root
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.rounds = {t.trial_id: 0 for t in trials}
        self.total_rounds = sum(t.spec.federation.rounds for t in trials) or 1
        self.done: set[str] = set()
        self.running: set[str] = set()
        self.started = time.monotonic()
        self.rounds_at_start: int | None = None
        self.width = max(len(t.label) for t in trials)
        self.storage_error: StorageUnwritable | None = None

    def __reduce__(self):
        # Tune pickles its run config, callbacks included, to restore a sweep later; a console
        # belongs to one process's terminal, so it unpickles as the restoring process's console.
        return (active_console, ())

    # Tune callback hooks
    def on_trial_start(self, iteration, trials, trial, **info):
        self.running.add(trial.config["trial_id"])
        self._progress()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.rounds[trial.config["trial_id"]] = int(result.get("round", 0))
        self._progress()

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._finished(trial.config["trial_id"], None)

    def on_trial_recover(self, iteration, trials, trial, **info):
        self._line("retry", self.trials[trial.config["trial_id"]],
                   f"attempt failed: {_last_line(trial.get_error())}")

    def on_trial_error(self, iteration, trials, trial, **info):
        try:
            probe_storage(self.root)
        except OSError as err:  # every further trial would fail the same way: stop here
            self.storage_error = StorageUnwritable(f"cannot write to {self.root}: {err}")
            raise self.storage_error from None
        self._finished(trial.config["trial_id"], _last_line(trial.get_error()))

    def start(self, already_done: list[str]) -> None:
        for trial_id in already_done:
            self.done.add(trial_id)
            self.rounds[trial_id] = self.trials[trial_id].spec.federation.rounds
        if already_done:
            self._print(f"resuming: {len(already_done)} of {len(self.trials)} trials already "
                        "finished")
        self.rounds_at_start = sum(self.rounds.values())

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()

    # rendering
    def _finished(self, trial_id: str, tune_error: str | None) -> None:
        trial = self.trials[trial_id]
        self.done.add(trial_id)
        self.running.discard(trial_id)
        self.rounds[trial_id] = trial.spec.federation.rounds
        row = results.read_trial(self.root, trial_id) or {}
        status = row.get("status") or "failed"
        if status == "ok":  # final mean and worst accuracy (per task for multi-task methods)
            keys = ["acc_mean", "acc_worst"] if "acc_mean" in row else sorted(
                k for k in row if k.startswith(("acc_mean_", "acc_worst_")) and "_at_" not in k)
            detail = "  ".join(f"{k} {'-' if row.get(k) is None else format(row[k], '.4f')}"
                               for k in keys)
        else:
            detail = _last_line(row.get("error")) or tune_error or "no tables written"
        seconds = f"  {row['wall_s']:.1f}s" if row.get("wall_s") is not None else ""
        self._line(status, trial, f"{detail}{seconds}")

    def _line(self, status: str, trial: Trial, detail: str) -> None:
        word = f"{status:<8}"
        if self.tty:
            word = f"\033[{self.COLOURS.get(status, '0')}m{word}\033[0m"
        count = f"[{len(self.done):>{len(str(len(self.trials)))}}/{len(self.trials)}]"
        text = f"{count} {word} {trial.label:<{self.width}}  {detail}"
        if not self.tty:
            text += f"  ({self._status()})"
        self._print(text)

    def _status(self) -> str:
        pending = len(self.trials) - len(self.done) - len(self.running)
        parts = [f"done {len(self.done)}/{len(self.trials)}", f"running {len(self.running)}",
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
    parser.add_argument("spec", help="sweep spec (YAML)")
    parser.add_argument("--storage", default=None,
                        help=f"results root: a path or s3://… (default {default_storage()})")
    parser.add_argument("--name", help="sweep name (default: the spec's name)")
    parser.add_argument("--resume", action="store_true",
                        help="require an existing sweep to resume (it resumes anyway if present)")
    parser.add_argument("--max-concurrent", type=int, help="trials in flight at once")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the trials and the resource plan; run nothing")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a sweep field or a base experiment "
                        "field, e.g. seeds=[0,1] or federation.rounds=5")
    parser.add_argument("--address", help="Ray cluster to join (default $RAY_ADDRESS, else local)")
    parser.add_argument("--num-cpus", type=int, help="CPUs of a locally started Ray")
    parser.add_argument("--num-gpus", type=float, help="logical GPUs of a locally started Ray")
    parser.add_argument("--verbose", action="store_true",
                        help="Tune's own progress tables and Ray's info logs instead of the "
                             "one-line-per-trial console")
    parser.add_argument("--dashboard", action="store_true",
                        help="start the local Ray with its dashboard on 127.0.0.1 and print "
                             "its URL")
    return parser.parse_args(argv)


def _local_totals(args: argparse.Namespace, wanted_gpus: float) -> dict[str, float]:
    gpus = args.num_gpus
    if gpus is None:
        gpus = torch.cuda.device_count() or (1.0 if wanted_gpus else 0.0)
    return {"CPU": float(args.num_cpus or os.cpu_count() or 1), "GPU": float(gpus)}


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
            "or an s3:// bucket with write access)"))]) from None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = list(args.overrides)
    if args.name:
        overrides.append(f"name={args.name}")
    if args.max_concurrent is not None:
        overrides.append(f"max_concurrent={args.max_concurrent}")
    storage = args.storage or default_storage()
    try:
        sweep, trials = load_sweep(args.spec, overrides)
        check_runnable([t.spec for t in trials])
    except SpecError as err:
        print(err, file=sys.stderr)
        return EXIT_SPEC
    root = f"{storage.rstrip('/')}/{sweep.name}"
    trial_ids = sorted(t.trial_id for t in trials)
    try:
        check_same_sweep(root, trial_ids)
        if args.resume and not tune.Tuner.can_restore(root):
            raise SpecError([("--resume", f"no sweep to resume at {root}; run without --resume "
                                          "to start it")])
    except SpecError as err:
        print(err, file=sys.stderr)
        return EXIT_SPEC
    wanted_gpus = max(t.spec.resources.gpus_per_worker for t in trials)
    if args.dry_run:
        address = args.address or os.environ.get("RAY_ADDRESS")
        if address:
            import ray

            ray.init(address=address, logging_level="error")
            total, where = ray.cluster_resources(), f"connected to {address}"
        else:
            total, where = _local_totals(args, wanted_gpus), "a local Ray would be started"
        print("\n".join(describe_plan(sweep, trials, total, where)))
        print(f"tables would go to {root}/tables/")
        return 0
    from raylf.raycluster import connect

    context = connect(args.address, args.num_gpus, wanted_gpus, num_cpus=args.num_cpus,
                      dashboard=args.dashboard, verbose=args.verbose)
    import ray

    try:
        check_plan(trials, ray.cluster_resources())
        check_storage(root)
    except SpecError as err:
        print(err, file=sys.stderr)
        return EXIT_SPEC
    address = args.address or os.environ.get("RAY_ADDRESS")
    where = f"joined {address}" if address else "local Ray"
    print("\n".join(describe_plan(sweep, trials, ray.cluster_resources(), where, listing=False)))
    if args.dashboard and context is not None and context.dashboard_url:
        print(f"dashboard: http://{context.dashboard_url}")
    print(f"tables: {root}/tables/", flush=True)
    claim(root, trial_ids)
    console = SweepConsole(trials, root)
    try:
        grid = run_sweep(sweep, trials, storage, console, args.verbose)
    except SpecError as err:
        print(err, file=sys.stderr)
        return EXIT_SPEC
    except tune.TuneError:  # how Tune passes on the console's StorageUnwritable
        if console.storage_error is None:
            raise
        console.finish()
        return _stopped(console.storage_error, root)
    finally:
        console.finish()
    board = leaderboard(root, trials)
    print(render(board))
    try:
        results.write_table(root, "leaderboard", "summary", results.to_table(
            board.to_dict("records"), results.provenance({"sweep": sweep.model_dump(mode="json")})))
    except OSError as err:
        return _stopped(StorageUnwritable(f"cannot write to {root}: {err}"), root)
    print(f"tables: {root}/tables/{{{','.join((*results.TABLES, 'leaderboard'))}}}/  "
          f"load them with raylf.results.load({root!r})")
    try:
        from raylf.report import write_report  # matplotlib: only once the sweep is done

        written = write_report(root, formats=("md", "html"))
        print(f"report: {written['html']} (markdown: {written['md']}; again: "
              f"python -m raylf.report {root})")
    except Exception as err:  # the tables are safe; a report problem must not fail the sweep
        print(f"report: not written ({type(err).__name__}: {err}); "
              f"python -m raylf.report {root}", file=sys.stderr)
    failed = [r for r in grid if r.error is not None]
    return EXIT_FAILED if failed else 0


def _stopped(err: StorageUnwritable, root: str) -> int:
    print(f"error: the sweep stopped: {err}. The tables of finished trials are intact under "
          f"{root}/tables/; make the storage writable (permissions, free space) and run the same "
          "command again: the sweep resumes.", file=sys.stderr)
    return EXIT_FAILED


def run_sweep(sweep: SweepSpec, trials: list[Trial], storage: str, console: SweepConsole,
              verbose: bool = False):
    import ray

    specs = {t.trial_id: t.spec.to_dict() for t in trials}
    trials_by_id = {t.trial_id: t for t in trials}
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, specs=specs, storage=storage, sweep=sweep.name,
                             checkpoint_every=sweep.checkpoint_every,
                             checkpoint_min_s=sweep.checkpoint_min_s),
        lambda config: tune.PlacementGroupFactory(
            trial_bundles(trials_by_id[config["trial_id"]].spec), strategy="PACK"))
    path = f"{storage.rstrip('/')}/{sweep.name}"
    run_config = tune.RunConfig(
        name=sweep.name, storage_path=storage,
        failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=CHECKPOINTS_KEPT),
        callbacks=[] if verbose else [console],
        verbose=None if verbose else 0)
    _consoles[:] = [] if verbose else [console]
    if not verbose:  # Tune's newer output engine prints its start block even at verbose=0
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    if tune.Tuner.can_restore(path):
        tuner = tune.Tuner.restore(path, trainable=trainable, resume_errored=True)
    else:
        fit = concurrent_fit(trials, ray.cluster_resources())
        tuner = tune.Tuner(
            trainable,
            param_space={"trial_id": tune.grid_search(sorted(specs))},
            tune_config=tune.TuneConfig(max_concurrent_trials=sweep.max_concurrent or
                                        max(1, fit), reuse_actors=False,
                                        trial_name_creator=lambda t: t.config["trial_id"],
                                        trial_dirname_creator=lambda t: t.config["trial_id"]),
            run_config=run_config,
        )
    console.start([t for t in sorted(specs) if finished_row(path, t) is not None])
    return tuner.fit()


def _sweep_marker(path: str):
    fs, base = results.filesystem(path)
    return fs, f"{base}/sweep.json"


def check_same_sweep(path: str, trial_ids: list[str]) -> None:
    """A sweep directory resumes only the sweep that created it (Tune's grid is fixed)."""
    import pyarrow.fs as pafs

    fs, marker = _sweep_marker(path)
    if fs.get_file_info(marker).type != pafs.FileType.File:
        return
    with fs.open_input_stream(marker) as f:
        before = json.loads(f.read())["trial_ids"]
    if before != trial_ids:
        raise SpecError([("name", (
            f"{path} holds a different sweep ({len(before)} trials, "
            f"{len(set(before) - set(trial_ids))} of them not in this spec); choose another "
            "--name or --storage, or remove that directory"))])


def claim(path: str, trial_ids: list[str]) -> None:
    """Record which trials this sweep directory holds (kept on resume)."""
    import pyarrow.fs as pafs

    fs, marker = _sweep_marker(path)
    if fs.get_file_info(marker).type == pafs.FileType.File:
        return
    with fs.open_output_stream(marker) as f:
        f.write(json.dumps({"trial_ids": trial_ids}).encode())


if __name__ == "__main__":
    # through the module's import name: Tune pickles the trainable and the console by reference
    from raylf.sweep import main as sweep_main

    sys.exit(sweep_main())
