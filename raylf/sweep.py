"""``python -m raylf.sweep SPEC.yaml``: a grid of experiments × seeds on Ray Tune.

Each trial is a Tune function trial that reserves one placement-group bundle for itself, one for
the coordinator and one per client worker; it reports every round, checkpoints every
``checkpoint_every`` rounds, and writes its own rows of the Arrow tables under
``<storage>/<name>/tables/``. A sweep directory that already exists is resumed (finished trials
are kept, unfinished ones continue from their last checkpoint).

Exit codes: 0 every trial finished (ok or diverged), 1 some trial failed after its retries,
2 invalid sweep spec or resources the cluster can never provide (nothing ran).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import torch

from raylf import results
from raylf.config import ExperimentSpec, SpecError
from raylf.leaderboard import leaderboard, render
from raylf.runtime.ray_backend import bundles
from raylf.sweepspec import SweepSpec, Trial, load_sweep

TRIAL_CPUS = 0.25  # bundle 0: the trial function, which only drives rounds and writes tables
EXIT_FAILED, EXIT_SPEC = 1, 2


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
    for trial in trials:
        for kind, amount in _needs(trial.spec).items():
            if amount > total.get(kind, 0) + 1e-9:
                field = "resources.gpus_per_worker" if kind == "GPU" else "resources"
                raise SpecError([(field, (
                    f"one trial needs {amount:g} {kind} ({trial_bundles(trial.spec)}), the Ray "
                    f"cluster has {total.get(kind, 0):g}; lower the per-trial resources or use a "
                    "larger cluster"))])


def describe_plan(sweep: SweepSpec, trials: list[Trial], total: dict[str, float],
                  where: str) -> list[str]:
    fit = concurrent_fit(trials, total)
    cap = sweep.max_concurrent
    lines = [f"{len(trials)} trials"]
    lines += [f"  {t.trial_id}  {t.label}" for t in trials]
    lines.append(f"bundles per trial: {trial_bundles(trials[0].spec)} (trial function, "
                 "coordinator, one per client worker)")
    resources = ", ".join(f"{k} {v:g}" for k, v in sorted(total.items()) if k in ("CPU", "GPU"))
    lines.append(f"cluster ({where}): {resources or 'no resources'}; {fit} trial(s) fit at once"
                 + (f", capped at {cap} by max_concurrent" if cap else ""))
    return lines


# ---- the Tune trial ---------------------------------------------------------------------------

def _scalars(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if isinstance(v, (int, float)) and v is not None}


def run_trial(config: dict[str, Any], *, specs: dict[str, dict], storage: str, sweep: str,
              checkpoint_every: int) -> None:
    """Tune function trial: one experiment, resumed from Tune's checkpoint when there is one."""
    import ray
    from ray import tune

    from raylf.config import validate
    from raylf.experiment import Progress, run_experiment

    trial_id = config["trial_id"]
    spec = validate(specs[trial_id])
    root = f"{storage.rstrip('/')}/{sweep}"
    finished = results.read_trial(root, trial_id)
    if finished is not None and finished["status"] in ("ok", "diverged"):
        # Tune may not have persisted this trial's end before the driver died: its tables say
        # it finished, so report that and do not run it again.
        tune.report({"trial_id": trial_id, "round": finished["rounds"], **{
            k: v for k, v in finished.items() if k.startswith("acc_") and v is not None}})
        return
    attempts = _mark_attempt(root, trial_id)
    progress, snapshot = Progress(), None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            progress = Progress(**json.loads((Path(folder) / "progress.json").read_text()))
            snapshot = torch.load(Path(folder) / "state.pt", weights_only=True)

    def on_round(outcome, runtime, prog, snapshot):
        metrics = {"trial_id": trial_id, **_scalars(outcome.record)}
        if snapshot is None:
            tune.report(metrics)
            return
        with tempfile.TemporaryDirectory() as folder:
            state = {"next_round": prog.next_round, "rounds": prog.rounds,
                     "clients": prog.clients, "wall_s": prog.wall_s}
            (Path(folder) / "progress.json").write_text(json.dumps(state))
            torch.save(snapshot, Path(folder) / "state.pt")
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))

    placement = (ray.util.get_current_placement_group(), 1)
    run_experiment(spec, backend="ray", out=root, trial_id=trial_id, sweep=sweep,
                   placement=placement, on_round=on_round, checkpoint_every=checkpoint_every,
                   progress=progress, snapshot=snapshot,
                   reraise=True, extra={"attempts": attempts})


def _mark_attempt(root: str, trial_id: str) -> int:
    """Leave one marker per start of a trial; the count is the trials table's ``attempts``."""
    import pyarrow.fs as pafs

    fs, base = results.filesystem(root)
    folder = f"{base}/attempts/{trial_id}"
    fs.create_dir(folder, recursive=True)
    with fs.open_output_stream(f"{folder}/{uuid.uuid4().hex}"):
        pass
    return len(fs.get_file_info(pafs.FileSelector(folder)))


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
    return parser.parse_args(argv)


def _local_totals(args: argparse.Namespace, wanted_gpus: float) -> dict[str, float]:
    gpus = args.num_gpus
    if gpus is None:
        gpus = torch.cuda.device_count() or (1.0 if wanted_gpus else 0.0)
    return {"CPU": float(args.num_cpus or os.cpu_count() or 1), "GPU": float(gpus)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = list(args.overrides)
    if args.name:
        overrides.append(f"name={args.name}")
    if args.max_concurrent:
        overrides.append(f"max_concurrent={args.max_concurrent}")
    try:
        sweep, trials = load_sweep(args.spec, overrides)
    except SpecError as err:
        print(err, file=sys.stderr)
        return EXIT_SPEC
    storage = args.storage or default_storage()
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
        print(f"tables would go to {storage.rstrip('/')}/{sweep.name}/tables/")
        return 0
    from raylf.raycluster import connect

    connect(args.address, args.num_gpus, wanted_gpus, num_cpus=args.num_cpus)
    import ray

    try:
        check_plan(trials, ray.cluster_resources())
        grid = run_sweep(sweep, trials, storage, args.resume)
    except SpecError as err:
        print(err, file=sys.stderr)
        return EXIT_SPEC
    root = f"{storage.rstrip('/')}/{sweep.name}"
    board = leaderboard(root, trials)
    print(render(board))
    results.write_table(root, "leaderboard", "summary", results.to_table(
        board.to_dict("records"), results.provenance({"sweep": sweep.model_dump(mode="json")})))
    print("tables:")
    for name in (*results.TABLES, "leaderboard"):
        print(f"  {name}: {root}/tables/{name}/")
    print(f"load them with: raylf.results.load({root!r})")
    failed = [r for r in grid if r.error is not None]
    return EXIT_FAILED if failed else 0


def run_sweep(sweep: SweepSpec, trials: list[Trial], storage: str, require_resume: bool):
    import ray
    from ray import tune

    specs = {t.trial_id: t.spec.to_dict() for t in trials}
    trials_by_id = {t.trial_id: t for t in trials}
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, specs=specs, storage=storage, sweep=sweep.name,
                             checkpoint_every=sweep.checkpoint_every),
        lambda config: tune.PlacementGroupFactory(
            trial_bundles(trials_by_id[config["trial_id"]].spec), strategy="PACK"))
    path = f"{storage.rstrip('/')}/{sweep.name}"
    _check_same_sweep(path, sorted(specs))
    if tune.Tuner.can_restore(path):
        print(f"resuming sweep {path}", flush=True)
        tuner = tune.Tuner.restore(path, trainable=trainable, resume_errored=True)
    elif require_resume:
        raise SpecError([("--resume", f"no sweep to resume at {path}")])
    else:
        fit = concurrent_fit(trials, ray.cluster_resources())
        tuner = tune.Tuner(
            trainable,
            param_space={"trial_id": tune.grid_search(sorted(specs))},
            tune_config=tune.TuneConfig(max_concurrent_trials=sweep.max_concurrent or
                                        max(1, fit), reuse_actors=False,
                                        trial_name_creator=lambda t: t.config["trial_id"],
                                        trial_dirname_creator=lambda t: t.config["trial_id"]),
            run_config=tune.RunConfig(
                name=sweep.name, storage_path=storage,
                failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=2), verbose=1),
        )
    return tuner.fit()


def _check_same_sweep(path: str, trial_ids: list[str]) -> None:
    """A sweep directory resumes only the sweep that created it (Tune's grid is fixed)."""
    fs, base = results.filesystem(path)
    marker = f"{base}/sweep.json"
    import pyarrow.fs as pafs

    if fs.get_file_info(marker).type == pafs.FileType.File:
        with fs.open_input_stream(marker) as f:
            before = json.loads(f.read())["trial_ids"]
        if before != trial_ids:
            raise SpecError([("name", (
                f"{path} holds a different sweep ({len(before)} trials, now {len(trial_ids)}); "
                "choose another --name or remove that directory"))])
        return
    fs.create_dir(base, recursive=True)
    with fs.open_output_stream(marker) as f:
        f.write(json.dumps({"trial_ids": trial_ids}).encode())


if __name__ == "__main__":
    sys.exit(main())
