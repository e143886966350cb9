"""``python -m raylf.run SPEC.yaml --out DIR``: one experiment, a progress line per round.

Exit codes: 0 finished, 1 failed or over ``resources.trial_timeout_s`` (tables written, the
reason in the trials table), 2 invalid spec, data or impossible resources (nothing ran),
3 diverged (tables written).
"""

from __future__ import annotations

import argparse
import os
import sys

from raylf.config import ResolvedSpec, load_spec
from raylf.errors import SpecError
from raylf.runtime import BACKENDS
from raylf.schema import name_problem
from raylf.storage import storage_root

EXIT_FAILED, EXIT_SPEC, EXIT_DIVERGED = 1, 2, 3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m raylf.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", help="experiment spec (YAML)")
    parser.add_argument("--out", required=True, help="directory (or s3:// URI) for the tables")
    parser.add_argument("--backend", choices=BACKENDS, default="ray")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a spec field, e.g. method.name=fedavg")
    parser.add_argument("--trial-id", help="name of this run's rows and files")
    parser.add_argument("--address", help="Ray cluster to join (default: $RAY_ADDRESS, else a "
                                          "local Ray started here)")
    parser.add_argument("--num-gpus", type=float, help="logical GPUs of a locally started Ray")
    return parser.parse_args(argv)


def enforce_time_budget(spec: ResolvedSpec, progress) -> None:
    """End the run as ``timeout`` once it has used ``resources.trial_timeout_s`` (a round hook:
    the budget is checked between rounds, each round being bounded by round_timeout_s)."""
    from raylf.experiment import RecordedStop

    budget = spec.resources.trial_timeout_s
    if budget is not None and progress.wall_s > budget:
        raise RecordedStop("timeout", (
            f"stopped after round {progress.next_round - 1} of {spec.federation.rounds}: "
            f"{progress.wall_s:.1f}s exceeds resources.trial_timeout_s={budget:g}; raise it, or "
            "lower federation.rounds"))


def progress_line(record: dict, rounds: int) -> str:
    """Mean and worst client accuracy (per task for multi-task methods) on evaluation rounds."""
    tasks = sorted(k[len("acc_mean"):] for k in record if k.startswith("acc_mean"))
    acc = "  ".join(f"acc_mean{t} {record['acc_mean' + t]:.4f}  acc_worst{t} "
                    f"{record['acc_worst' + t]:.4f}" for t in tasks
                    if "acc_worst" + t in record) or "acc_mean    -    acc_worst    -   "
    return (f"round {record['round']:>4}/{rounds}  {acc}  loss {record['loss']:.4f}  "
            f"{record['round_s']:.2f}s")


def standin_notice(spec: ResolvedSpec) -> str:
    """The line that says, before the first round and after the last, that this run reads a
    stand-in (raylf.data.standin), so its figures are never taken for the real dataset's."""
    from raylf.data.cache import data_root
    from raylf.data.standin import notice

    name = spec.dataset.name
    return notice(name, data_root(getattr(spec.dataset_params, "root", None)) / name)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from raylf.preflight import check_runnable

    try:
        out = storage_root(args.out, "--out")
        spec = load_spec(args.spec, args.overrides)
        problem = None if args.trial_id is None else name_problem(args.trial_id)
        if problem is not None:
            raise SpecError([("--trial-id", f"{problem} (got {args.trial_id!r})")])
        standins = check_runnable([spec]).standins()
    except SpecError as err:
        print(err, file=sys.stderr)
        return EXIT_SPEC
    if standins:
        print(standin_notice(spec), flush=True)
    from raylf.experiment import run_experiment

    if args.backend == "ray":
        import ray

        from raylf.raycluster import connect, local_totals
        from raylf.runtime.ray_backend import check_fits

        if not (args.address or os.environ.get("RAY_ADDRESS") or ray.is_initialized()):
            try:  # a local Ray that could never host the run is not started
                check_fits(spec.resources, spec.active_workers(),
                           local_totals(None, args.num_gpus, spec.resources.gpus_per_worker))
            except SpecError as err:
                print(err, file=sys.stderr)
                return EXIT_SPEC
        connect(args.address, args.num_gpus, spec.resources.gpus_per_worker)
    rounds = spec.federation.rounds

    def report(outcome, runtime, progress, snapshot):
        print(progress_line(outcome.record, rounds), flush=True)
        enforce_time_budget(spec, progress)

    try:
        result = run_experiment(spec, backend=args.backend, out=out,
                                trial_id=args.trial_id, on_round=report)
    except SpecError as err:
        print(err, file=sys.stderr)
        return EXIT_SPEC
    trial = result.trial
    finals = "  ".join(f"{k} {v:.4f}" for k, v in trial.items()
                       if k.startswith("acc_mean") and v is not None)
    print(f"status {result.status}: {trial['rounds']} rounds in {trial['wall_s']:.1f}s; "
          f"final {finals or 'accuracy -'}")
    if result.error:
        print(result.error, file=sys.stderr)
    print("tables:")
    for name, path in result.paths.items():
        print(f"  {name}: {path}")
    print(f"load them with: raylf.results.load({out!r})")
    if standins:
        print(standin_notice(spec))
    return {"ok": 0, "diverged": EXIT_DIVERGED}.get(result.status, EXIT_FAILED)


if __name__ == "__main__":
    sys.exit(main())
