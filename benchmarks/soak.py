"""Soak: many tiny trials under random worker kills and one driver kill; nothing lost or doubled.

    python benchmarks/soak.py [--trials 200] [--kill-probability 0.02] [--out DIR]

One sweep of ``--trials`` seeds of a tiny FedAvg experiment runs as ``python -m raylf.sweep``.
Each round, each client worker ``ray.kill``s itself with ``--kill-probability`` (so Tune retries
that trial from its checkpoint); once half the trials have finished, the driver is SIGKILLed
with its local Ray, and the same command runs again to the end. The report counts trials
completed, retries (``attempts`` − 1), and rows lost or duplicated in the tables (both must be
0); the exit code is 1 if any row is lost or duplicated.

This module is also the plugin that makes the workers kill themselves (``RAYLF_PLUGINS=soak``).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from local_ray import warn_token_auth_off  # this script's folder
from pydantic import Field

from raylf.methods import METHODS
from raylf.methods.base import MethodParams
from raylf.methods.fedavg import FedAvg

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 3


class SoakParams(MethodParams):
    kill_probability: float = Field(0.02, ge=0, le=1, description="per worker and round")


class SoakFedAvg(FedAvg):
    """FedAvg whose worker kills itself (``ray.kill``) at random rounds."""

    name = "soak_fedavg"
    Params = SoakParams

    def local_update(self, client):
        if random.random() < self.params.kill_probability:
            import ray

            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
            time.sleep(60)  # the kill lands while the round is in flight
        return super().local_update(client)


if "soak_fedavg" not in METHODS:
    METHODS.register("soak_fedavg")(SoakFedAvg)


def sweep_spec(trials: int, kill_probability: float) -> dict:
    return {
        "name": "soak",
        "experiment": {
            "dataset": {"name": "digits"},
            "scenario": {"name": "label_subset", "k": 2},
            "model": {"name": "mlp", "hidden": [16]},
            "method": {"name": "soak_fedavg"},
            "federation": {"num_clients": 4, "participation": 1.0, "rounds": ROUNDS,
                           "batch_size": 64},
            "eval_every": ROUNDS,
        },
        "methods": [{"name": "soak_fedavg", "params": {"kill_probability": kill_probability}}],
        "seeds": list(range(trials)),
        "resources": {"workers": 1, "cpus_per_worker": 0.25, "coordinator_cpus": 0.25},
        "checkpoint_every": 1,
        "checkpoint_min_s": 0,
        "max_failures": 20,
    }


def finished(root: Path) -> int:
    return len(list((root / "tables" / "clients").glob("*.parquet")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--kill-probability", type=float, default=0.02,
                        help="chance that a worker kills itself in a round")
    parser.add_argument("--out", help="storage root (default: a temporary directory)")
    args = parser.parse_args(argv)

    from raylf import results

    out = Path(args.out or tempfile.mkdtemp(prefix="raylf-soak-"))
    spec = out / "soak.yaml"
    out.mkdir(parents=True, exist_ok=True)
    spec.write_text(yaml.safe_dump(sweep_spec(args.trials, args.kill_probability)))
    root = out / "soak"
    env = {**os.environ, "RAYLF_PLUGINS": "soak", "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(ROOT)])}
    warn_token_auth_off(env)
    command = [sys.executable, "-m", "raylf.sweep", str(spec), "--storage", str(out)]
    started = time.monotonic()

    log = (out / "sweep.log").open("a")  # both runs' console and Ray/Tune messages
    driver = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log,
                              start_new_session=True)
    while finished(root) < args.trials // 2 and driver.poll() is None:
        time.sleep(0.2)
    driver_killed = driver.poll() is None
    if driver_killed:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        while _group_alive(driver.pid):
            time.sleep(0.2)
    rerun = subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=log)
    log.close()

    tables = results.load(root)
    trials, rounds = tables["trials"], tables["rounds"]
    expected = {f"seed {s}" for s in range(args.trials)}
    present = {f"seed {s}" for s in trials["seed"]} if len(trials) else set()
    lost_trials = len(expected - present)
    lost_rounds = sum(max(0, ROUNDS - n) for n in
                      rounds.groupby("trial_id")["round"].nunique().reindex(
                          trials["trial_id"], fill_value=0))
    duplicated = int(trials["trial_id"].duplicated().sum()) + int(
        rounds.duplicated(["trial_id", "round"]).sum())
    report = {
        "trials": args.trials,
        "completed": int((trials["status"] == "ok").sum()),
        "retries": int((trials["attempts"] - 1).sum()),
        "driver killed": driver_killed,
        "rows lost": lost_trials + lost_rounds,
        "rows duplicated": duplicated,
        "rerun exit code": rerun.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "tables": str(root / "tables"),
        "log": str(out / "sweep.log"),
    }
    for key, value in report.items():
        print(f"{key:>16}: {value}")
    return 1 if report["rows lost"] or report["rows duplicated"] else 0


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
