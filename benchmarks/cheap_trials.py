"""Cheap trials: a sweep of many short trials against the compute its trials do.

Most PFL sweeps are hundreds of trials of seconds each; there the sweep's own costs (Ray and Tune
start, placement groups, actor start, table writes, Tune's per-trial bookkeeping) can exceed the
training. This measures by how much, on one workload:

- the sweep: 48 trials of a 10-round MLP on digits, FedProx's μ (4) × lr (3) over 4 seeds, one
  worker of half a CPU each (``python -m raylf.sweep`` with ``--num-cpus CORES``);
- its compute bound: each of the same 48 trials run in this process (``run_experiment``,
  ``--backend local``), timed; their sum divided by ``CORES``.

It prints and writes (``--out``, JSON) the bound, the sweep's process wall (what a user waits
for, start-up and report included) and its trial phase (from the line naming the tables, after
Ray's start and the plan, to the last trial's line), and their ratios to the bound.
``--rounds`` lengthens every trial (evaluation stays every 5 rounds): the sweep's own costs are
mostly per process and per trial, not per round, so their share shrinks as trials grow.

    python benchmarks/cheap_trials.py [--cores 2] [--rounds 10] [--per-tune-trial K]
                                      [--out /tmp/cheap.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.local_ray import warn_token_auth_off  # noqa: E402
from raylf.experiment import run_experiment  # noqa: E402
from raylf.sweep.spec import load_sweep  # noqa: E402

SWEEP = {
    "name": "cheap",
    "experiment": {
        "dataset": {"name": "digits"},
        "scenario": {"name": "label_subset", "k": 2},
        "model": {"name": "mlp", "hidden": [32]},
        "method": {"name": "fedprox"},
        "federation": {"num_clients": 10, "participation": 0.5, "rounds": 10, "batch_size": 32,
                       "optimizer": {"lr": 0.05}},
        "eval_every": 5,
        # one worker of half a CPU, trained in the trial function's own process (its quarter
        # CPU beside it: raylf.sweep.placement), so two trials run at once on two cores
        "resources": {"workers": 1, "cpus_per_worker": 0.5},
    },
    "methods": [{"name": "fedprox", "grid": {"method.params.mu": [0.0, 0.001, 0.01, 0.1],
                                             "federation.optimizer.lr": [0.02, 0.05, 0.1]}}],
    "seeds": [0, 1, 2, 3],
}


def compute_bound(spec_path: Path, cores: int) -> dict:
    """Every trial of the sweep in this process, timed (the first run once untimed: imports), on
    as many torch threads as the sweep gives each trial's worker (the local backend would use
    all cores, and the bound divides by the cores already)."""
    _, trials = load_sweep(spec_path)
    torch.set_num_threads(trials[0].spec.resources.threads_per_worker())
    with tempfile.TemporaryDirectory() as out:
        run_experiment(trials[0].spec, backend="local", out=out, trial_id="warm")
        times = []
        for trial in trials:
            start = time.perf_counter()
            run_experiment(trial.spec, backend="local", out=out, trial_id=trial.trial_id)
            times.append(time.perf_counter() - start)
    return {"trials": len(trials), "trial_s": times, "sum_s": sum(times),
            "bound_s": sum(times) / cores}


def sweep_wall(spec_path: Path, cores: int, trials: int) -> dict:
    """The sweep as a user runs it; stamps when its tables line and its last trial line print."""
    with tempfile.TemporaryDirectory() as storage:
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "raylf.sweep", str(spec_path), "--storage", storage,
             "--num-cpus", str(cores)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)
        tables_at = last_at = None
        for line in proc.stdout:
            if line.startswith("tables:") and tables_at is None:
                tables_at = time.perf_counter() - start
            if line.startswith(f"[{trials}/{trials}]"):
                last_at = time.perf_counter() - start
        proc.wait()
        wall = time.perf_counter() - start
    if proc.returncode or tables_at is None or last_at is None:
        raise RuntimeError(f"the sweep failed (exit {proc.returncode})")
    return {"process_s": wall, "start_s": tables_at, "trial_phase_s": last_at - tables_at}


def main(argv: list[str] | None = None) -> int:
    warn_token_auth_off({"RAY_AUTH_MODE": "disabled"})  # what sweep_wall's drivers run with
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10, help="rounds of every trial")
    parser.add_argument("--per-tune-trial", type=int, default=1, metavar="K",
                        help="the sweep's trials_per_tune_trial (trials one Tune trial runs)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    sweep = {**SWEEP, "experiment": {**SWEEP["experiment"], "federation": {
        **SWEEP["experiment"]["federation"], "rounds": args.rounds}},
             "trials_per_tune_trial": args.per_tune_trial}
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = Path(tmp) / "cheap.yaml"
        spec_path.write_text(yaml.safe_dump(sweep, sort_keys=False))
        bound = compute_bound(spec_path, args.cores)
        wall = sweep_wall(spec_path, args.cores, bound["trials"])
    result = {**bound, **wall, "cores": args.cores, "rounds": args.rounds,
              "per_tune_trial": args.per_tune_trial,
              "process_over_bound": wall["process_s"] / bound["bound_s"],
              "trial_phase_over_bound": wall["trial_phase_s"] / bound["bound_s"]}
    print(f"{bound['trials']} trials: compute {bound['sum_s']:.1f} s in process, bound "
          f"{bound['bound_s']:.1f} s on {args.cores} cores; sweep {wall['process_s']:.1f} s "
          f"process wall ({result['process_over_bound']:.2f}x the bound), trial phase "
          f"{wall['trial_phase_s']:.1f} s ({result['trial_phase_over_bound']:.2f}x), start "
          f"{wall['start_s']:.1f} s")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
