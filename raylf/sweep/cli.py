"""The sweep's command line: its arguments, and the order of what ``python -m raylf.sweep`` does
(check the specs, data and plan, claim the sweep directory, run the stages, print the leaderboard
and write the tables and report), with the exit codes of ``raylf.sweep``."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from functools import partial
from pathlib import Path

import ray

import raylf.sweep
from raylf import results, storage
from raylf.errors import SpecError
from raylf.preflight import check_runnable
from raylf.raycluster import Capacity, local_totals
from raylf.sweep import estimate, smoke
from raylf.sweep.claim import check_same_sweep, claim, claimed, identity_hash, sweep_identity
from raylf.sweep.leaderboard import leaderboard, render
from raylf.sweep.lease import Lease, acquire
from raylf.sweep.load import load_specs
from raylf.sweep.notices import data_notices
from raylf.sweep.placement import (
    check_placement,
    concurrent_fit,
    describe_placement,
    resource_lines,
)
from raylf.sweep.recipes import cluster_recipe
from raylf.sweep.stages import GridStage, describe_search, search_then_replicate
from raylf.sweep.trackers import TRACKERS, tracker_callbacks
from raylf.sweep.tuner import Interrupted, run_stage
from raylf.sweep.writable import StorageUnwritable, check_storage, unusable

EXIT_FAILED, EXIT_SPEC, EXIT_INTERRUPTED = 1, 2, 130


def default_storage() -> str:
    return str(Path("~/raylf_results").expanduser().resolve())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m raylf.sweep", description=raylf.sweep.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", nargs="+", help="sweep spec (YAML); several only with --smoke "
                        "or --dry-run")
    parser.add_argument("--storage", default=None,
                        help=f"results root: a path or s3://… (default {default_storage()})")
    parser.add_argument("--name", help="sweep name (default: the spec's name)")
    parser.add_argument("--resume", action="store_true",
                        help="require an existing sweep to resume (it resumes anyway if present)")
    parser.add_argument("--force", action="store_true",
                        help="run in a sweep directory that is not empty but holds no sweep "
                             "(refused without it)")
    parser.add_argument("--max-concurrent", type=int, help="trials in flight at once")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the trials, the resource plan and the data still to fetch; "
                             "run nothing (works before the data are downloaded)")
    parser.add_argument("--smoke", action="store_true",
                        help="run every distinct configuration once (one seed, --smoke-rounds "
                             "rounds, resources shrunk to this machine, stand-in data where a "
                             "dataset is not fetched) into <name>-smoke; results are no results")
    parser.add_argument("--smoke-rounds", type=int, default=smoke.SMOKE_ROUNDS, metavar="N",
                        help=f"rounds of each smoke trial (default {smoke.SMOKE_ROUNDS})")
    parser.add_argument("--smoke-paths", action="store_true",
                        help="smoke-run one configuration per code path (a method with its "
                             "non-numeric parameters × model × dataset) instead of every one")
    parser.add_argument("--estimate", action="store_true",
                        help="time --estimate-rounds rounds of every distinct configuration "
                             "here (or on the cluster joined) and print trial times, "
                             "device-hours and wall time; runs into <name>-estimate")
    parser.add_argument("--estimate-rounds", type=int, default=estimate.ESTIMATE_ROUNDS,
                        metavar="N", help="rounds timed per configuration (default "
                                          f"{estimate.ESTIMATE_ROUNDS})")
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
                             "Tune's callbacks (offline, under the sweep directory), or keep "
                             "Tune's JSON record of each trial (json); repeatable")
    parser.add_argument("--dashboard", action="store_true",
                        help="start the local Ray with its dashboard on 127.0.0.1 and print "
                             "its URL")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with contextlib.ExitStack() as held:  # the sweep's lease, released however the sweep ends
        return _sweep(args, held)


def _sweep(args: argparse.Namespace, held: contextlib.ExitStack) -> int:
    overrides = list(args.overrides)
    derived = args.smoke or args.estimate  # their sweep is derived from the spec's
    if args.name and not derived:
        overrides.append(f"name={args.name}")
    if args.max_concurrent is not None and not derived:
        overrides.append(f"max_concurrent={args.max_concurrent}")
    try:
        base = storage.storage_root(args.storage or default_storage())
        loaded = load_specs(args, overrides)
        sweep, trials, probes = loaded.sweep, loaded.trials, loaded.probes
        searches = loaded.searches
        check = check_runnable([t.spec for t in trials + probes], missing_ok=args.dry_run)
        root = f"{base.rstrip('/')}/{sweep.name}"
        trackers = tracker_callbacks(args.log, root, sweep.name)
        identity = sweep_identity(sweep, trials, searches)
        if not args.dry_run:
            check_same_sweep(root, identity, args.force)
        if args.resume and not claimed(root):
            raise SpecError([("--resume", f"no sweep to resume at {root}; run without --resume "
                                          "to start it")])
        recipe = cluster_recipe(args.cluster) if args.cluster else None
    except SpecError as err:
        print(err, file=sys.stderr)
        return EXIT_SPEC
    sizing = trials + probes  # every trial the sweep may run is like one of these
    wanted_gpus = max(t.spec.resources.gpus_per_worker for t in sizing)

    def describe(cluster: Capacity, where: str, listing: bool = True) -> list[str]:
        if not searches:
            return describe_placement(sweep, trials, cluster, where, listing)
        return describe_search(sweep, searches, trials) + resource_lines(sweep, sizing, cluster,
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
            check_placement(sizing, local)
        except SpecError as err:
            print(err, file=sys.stderr)
            return EXIT_SPEC
    try:  # before Ray starts: a second driver of this directory starts nothing
        lease = take_lease(root, identity, args.force)
    except SpecError as err:
        print(err, file=sys.stderr)
        return EXIT_SPEC
    held.callback(lease.release)
    context = connect(args.address, args.num_gpus, wanted_gpus, num_cpus=args.num_cpus,
                      dashboard=args.dashboard, verbose=args.verbose)
    storage.one_line_storage_errors()
    cluster = capacity()
    try:
        if cluster.most is not None:  # else trials wait for the nodes an autoscaler adds
            check_placement(sizing, cluster.most)
        check_storage(root)  # after the plan: impossible resources leave no directory behind
    except SpecError as err:
        lease.release(discard=True)  # impossible resources leave no directory behind
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
        if searches:
            trials, choices, failed = search_then_replicate(sweep, searches, trials, base, run)
        else:
            grid = run(GridStage(trials, sweep.name, base, sweep.trials_per_tune_trial))
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
        print(smoke.summary(root, trials))
        return EXIT_FAILED if failed else 0
    if args.estimate:
        print(estimate.summary(root, loaded, time.perf_counter() - started, cluster, where,
                               recipe))
        return EXIT_FAILED if failed else 0
    try:
        # one file per table, for readers without options, and what the leaderboard, the
        # report and later readers read instead of a file a trial (results.read_table)
        compacted = results.compact(root)
        board = leaderboard(root, trials, choices)
        print(render(board))
        results.write_table(root, "leaderboard", "summary", results.to_table(
            board.to_dict("records"), results.provenance({"sweep": sweep.model_dump(mode="json")})))
        compacted |= results.compact(root, ["leaderboard"])
    except OSError as err:
        return _stopped(StorageUnwritable(f"cannot write to {root}: {err}"), root)
    print(f"tables: {root}/tables/{{{','.join((*results.TABLES, 'leaderboard'))}}}/  "
          f"load them with raylf.results.load({root!r})")
    if compacted:
        print(f"one file per table: {root}/{results.COMPACT}/tables/<table>/<table>.parquet "
              "(pandas, polars and duckdb read each as it is)")
    if searches:
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


def take_lease(root: str, identity: dict, force: bool) -> Lease:
    """This driver's lease of the sweep directory (raylf.sweep.lease), and the directory checked
    again under it: no other sweep can have claimed it since the first check."""
    try:
        lease, taken = acquire(root, identity_hash(identity))
    except OSError as err:
        raise unusable(f"write to {root}", err) from None
    try:
        check_same_sweep(root, identity, force)
    except SpecError:
        lease.release(discard=True)
        raise
    if taken is not None:
        print(f"lease: took over {root} from a stale lease (its driver no longer runs on "
              f"this host, or it was not renewed for {taken.expiry_s:g} s): "
              f"{taken.describe(lease.clock(), taken.sweep)}", flush=True)
    if not lease.atomic:
        print(f"note: {root.split('://')[0]}:// offers no atomic create here, so two drivers "
              "started in the same instant could both take this sweep's lease",
              file=sys.stderr, flush=True)
    return lease


def _stopped(err: StorageUnwritable, root: str) -> int:
    print(f"error: the sweep stopped: {err}. The tables of finished trials are intact under "
          f"{root}/tables/; once the storage takes writes again (permissions, free space; for "
          "object storage the endpoint reachable and the credentials valid) run the same command "
          "again: the sweep resumes.", file=sys.stderr)
    return EXIT_FAILED
