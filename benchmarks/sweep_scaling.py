"""Sweep scaling: what a sweep costs per trial as it grows to thousands of trials.

One grid sweep per size (``--sizes``, default 100, 1,000 and 10,000) of the same tiny trial
(FedProx on the bundled digits, 6 clients, 3 rounds, one worker of half a CPU: each trial
differs only in its seed), run as a user runs it (``python -m raylf.sweep``, a local Ray of
``--cores`` CPUs, a local ``--storage``). Per size it records:

- the process wall (what a user waits for: Ray's start, the plan, the trials, the report), the
  trial phase (from the line naming the tables to the last trial's line) and the time after
  the last trial (Tune's wrap-up, the leaderboard, the compacted tables and the report);
- the bound: the trials' own compute over the cores, from ``--sample`` of the trials run in
  this process (``run_experiment``, local backend, one torch thread as a sweep worker of half
  a CPU gets; one untimed run first) times the size;
- the driver's peak RSS (its own ``getrusage``, not Ray's processes), and its RSS every 2 s
  against the trials done;
- bytes and objects written to the storage by kind, counted by the kernel while the sweep
  runs (``benchmarks/storage_writes.py``): Tune's state (experiment state, searcher state,
  tuner), Tune's trial logs, the tables (a trial's trials row twice: ``started``, then its
  end), checkpoints, compacted tables, report; the objects left per trial at the end, and
  the size of Tune's experiment-state file;
- the wall per extra trial between consecutive sizes.

``--resume-check N`` instead runs a sweep of N trials, SIGKILLs its driver and local Ray once
half of them have finished, runs the same command again to the end, and checks that every
trial's tables were written exactly once (one trials-table file published per trial, the
trials table unique, every round once) and that the trials finished before the kill were not
started again.

    python benchmarks/sweep_scaling.py [--sizes 100 1000 10000] [--cores 2] [--per-tune-trial K]
                                       [--out FILE]
    python benchmarks/sweep_scaling.py --resume-check 1000 [--out FILE]

Measure on a quiet machine if you can; ``uptime`` is recorded before and after each sweep,
and only ratios within one invocation compare.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.storage_writes import StorageWrites  # noqa: E402

NAME = "scale"
EXPERIMENT = {
    "dataset": {"name": "digits"},
    "scenario": {"name": "label_subset", "k": 2},
    "model": {"name": "mlp", "hidden": [16]},
    "method": {"name": "fedprox"},
    "federation": {"num_clients": 6, "participation": 0.5, "rounds": 3, "batch_size": 32},
    "eval_every": 3,
    "resources": {"workers": 1, "cpus_per_worker": 0.5},
}
TUNE_STATE = ("experiment_state-", "basic-variant-state-", "searcher-state-", "tuner.pkl",
              "trainable.pkl", ".validate_storage_marker")
# the driver, with its peak RSS written where the benchmark reads it once the sweep returns
DRIVER = ("import json, resource, sys\n"
          "from raylf.sweep.cli import main\n"
          "code = main(sys.argv[2:])\n"
          "with open(sys.argv[1], 'w') as f:\n"
          "    json.dump({'driver_peak_rss_mb': resource.getrusage(resource.RUSAGE_SELF)"
          ".ru_maxrss / 1024}, f)\n"
          "sys.exit(code)\n")


def write_spec(folder: Path, trials: int, per_tune_trial: int = 1) -> Path:
    path = folder / f"scale-{trials}-{per_tune_trial}.yaml"
    path.write_text(yaml.safe_dump({"name": NAME, "experiment": EXPERIMENT,
                                    "seeds": list(range(trials)),
                                    "trials_per_tune_trial": per_tune_trial}, sort_keys=False))
    return path


def kind(relative: str) -> str | None:
    """What a file under the storage root is, by its path (``<sweep>/...``)."""
    parts = relative.split("/")[1:]
    if ".staging" in parts or not parts:
        return None
    if parts[0] == "search":  # a search stage's root: the same layout below it
        parts = parts[1:]
    head = parts[0]
    if head in ("tables", "checkpoints", "report"):
        return head
    if head == "compact":
        return "compacted tables"
    if any(p.startswith("checkpoint_") for p in parts):
        return "checkpoints"
    if parts[-1].startswith(TUNE_STATE):  # in the sweep's folder or a part's (part-<i>/)
        return "tune state"
    return "sweep" if len(parts) == 1 else "tune trial logs"


def _workdir(keep: Path | None, prefix: str):
    """``keep`` (left in place for a look afterwards), else a temporary folder."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        return contextlib.nullcontext(str(keep))
    return tempfile.TemporaryDirectory(prefix=prefix)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def compute_bound(spec_path: Path, cores: int, sample: int) -> dict:
    """Mean in-process time of ``sample`` of the sweep's trials (one untimed first)."""
    import torch

    from raylf.experiment import run_experiment
    from raylf.sweep.spec import load_sweep

    _, trials = load_sweep(spec_path)
    torch.set_num_threads(trials[0].spec.resources.threads_per_worker())
    step = max(1, len(trials) // sample)
    chosen = trials[::step][:sample]
    with tempfile.TemporaryDirectory() as out:
        run_experiment(trials[-1].spec, backend="local", out=out, trial_id="warm")
        times = []
        for trial in chosen:
            start = time.perf_counter()
            run_experiment(trial.spec, backend="local", out=out, trial_id=trial.trial_id)
            times.append(time.perf_counter() - start)
    mean = sum(times) / len(times)
    return {"sampled": len(times), "trial_s": mean, "bound_s": mean * len(trials) / cores}


def start_driver(spec_path: Path, storage: Path, cores: int, rss_file: Path,
                 stderr) -> subprocess.Popen:
    """The sweep's driver, its console on a pipe this process reads line by line and its
    stderr in a file (a pipe nobody reads while the console is read fills up and stops the
    driver at its next warning)."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(rss_file), str(spec_path), "--storage", str(storage),
         "--num-cpus", str(cores)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=stderr, text=True, start_new_session=True)


def sweep(spec_path: Path, storage: Path, cores: int, trials: int) -> dict:
    """The sweep as a user runs it, with time stamps of its console lines and its writes."""
    rss_file = storage.parent / f"rss-{trials}.json"
    writes = StorageWrites(storage, kind).start()
    before = uptime()
    start = time.perf_counter()
    err_file = (storage.parent / f"stderr-{trials}.txt").open("w+")
    driver = start_driver(spec_path, storage, cores, rss_file, err_file)
    stamps: dict[str, float] = {}
    last = f"[{trials}/{trials}]"
    done = [0]  # trial lines so far
    samples: list[tuple[float, int, float]] = []  # (s since start, trials done, driver RSS MB)
    sampling = threading.Event()

    def sample_rss() -> None:
        process = psutil.Process(driver.pid)
        while not sampling.wait(2.0):
            try:
                rss = process.memory_info().rss / 2**20
            except psutil.NoSuchProcess:
                return
            samples.append((round(time.perf_counter() - start, 1), done[0], round(rss)))

    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()
    for line in driver.stdout:
        now = time.perf_counter() - start
        if line.startswith("["):
            done[0] += 1
        if line.startswith("tables:") and "tables" not in stamps:
            stamps["tables"] = now
        elif line.startswith(last):
            stamps["last_trial"] = now
        elif line.startswith("leaderboard") and "leaderboard" not in stamps:
            stamps["leaderboard"] = now
        elif line.startswith("report:"):
            stamps["report"] = now
    driver.wait()
    err_file.seek(0)
    err = err_file.read()
    err_file.close()
    wall = time.perf_counter() - start
    sampling.set()
    sampler.join()
    writes.stop()
    if driver.returncode or "last_trial" not in stamps:
        raise RuntimeError(f"the sweep failed (exit {driver.returncode}):\n{err[-3000:]}")
    states = list((storage / NAME).glob("**/experiment_state-*.json"))
    left = [p for p in (storage / NAME).rglob("*") if p.is_file() and ".staging" not in p.parts]
    trials_table = pq.read_table(storage / NAME / "compact" / "tables" / "trials" /
                                 "trials.parquet", columns=["wall_s"])
    return {
        "trials": trials, "uptime_before": before, "uptime_after": uptime(),
        "process_s": wall, "start_s": stamps["tables"],
        "trial_phase_s": stamps["last_trial"] - stamps["tables"],
        "after_trials_s": wall - stamps["last_trial"],
        # Tune's end of the last experiment and the compaction, then the leaderboard and the
        # report (which read the compacted tables)
        "end_and_compaction_s": stamps.get("leaderboard", wall) - stamps["last_trial"],
        "report_s": wall - stamps.get("leaderboard", wall),
        **json.loads(rss_file.read_text()),
        # the largest experiment-state file (one a Tune experiment: part-<i>/ above 2,000)
        "tune_state_file_mb": max(p.stat().st_size for p in states) / 2**20,
        "tune_experiments": len(states),
        # the issue's bound: the trials' own wall in the sweep (trials table), over the cores
        "in_sweep_bound_s": sum(trials_table.column("wall_s").to_pylist()) / cores,
        "objects_written": dict(writes.objects), "bytes_written": dict(writes.bytes),
        "objects_left": len(left), "objects_left_per_trial": len(left) / trials,
        "inotify_overflows": writes.overflows,
        "vanished_before_stat": writes.vanished,
        "driver_rss_samples": samples}


def per_trial(record: dict) -> dict:
    """Objects written per trial by kind (what scales with the trials)."""
    return {k: v / record["trials"] for k, v in sorted(record["objects_written"].items())}


def scaling(args) -> dict:
    records = []
    with _workdir(args.keep, "raylf-scale-") as tmp:
        for trials in args.sizes:
            spec_path = write_spec(Path(tmp), trials, args.per_tune_trial)
            bound = compute_bound(spec_path, args.cores, args.sample)
            record = {**sweep(spec_path, Path(tmp) / f"storage-{trials}", args.cores, trials),
                      **bound}
            record["process_over_bound"] = record["process_s"] / record["bound_s"]
            records.append(record)
            print(json.dumps({k: v for k, v in record.items() if not isinstance(v, (dict, list))}),
                  flush=True)
    for before, after in zip(records, records[1:]):
        extra = after["trials"] - before["trials"]
        after["wall_per_extra_trial_s"] = (after["process_s"] - before["process_s"]) / extra
        after["bound_per_extra_trial_s"] = (after["bound_s"] - before["bound_s"]) / extra
        after["extra_trials_over_bound"] = (
            after["wall_per_extra_trial_s"] / after["bound_per_extra_trial_s"])
        after["extra_trials_over_in_sweep_bound"] = (
            (after["process_s"] - before["process_s"])
            / (after["in_sweep_bound_s"] - before["in_sweep_bound_s"]))
    for later, earlier in zip(records[2:], records[1:]):
        later["extra_wall_growth"] = (later["wall_per_extra_trial_s"]
                                      / earlier["wall_per_extra_trial_s"])
    return {"cores": args.cores, "per_tune_trial": args.per_tune_trial, "records": records}


def resume_check(args) -> dict:
    """Kill the driver once half the trials finished, run again; every trial written once."""
    from raylf import results

    trials = args.resume_check
    with _workdir(args.keep, "raylf-resume-") as tmp:
        spec_path = write_spec(Path(tmp), trials, args.per_tune_trial)
        storage = Path(tmp) / "storage"
        root = storage / NAME
        writes = StorageWrites(storage, kind).start()
        before = uptime()
        driver = start_driver(spec_path, storage, args.cores, Path(tmp) / "rss.json",
                              subprocess.DEVNULL)
        half = f"[{trials // 2:>{len(str(trials))}}/{trials}]"
        for line in driver.stdout:
            if line.startswith(half):
                break
        finished_before = set(results.read_table(root, "trials").column("trial_id").to_pylist())
        os.killpg(driver.pid, signal.SIGKILL)
        driver.communicate()
        killed_at = uptime()
        attempts_before = {t: results.read_trial(root, t)["attempts"] for t in finished_before}
        driver = start_driver(spec_path, storage, args.cores, Path(tmp) / "rss.json",
                              subprocess.PIPE)
        out, err = driver.communicate()
        writes.stop()
        if driver.returncode:
            raise RuntimeError(f"the resumed sweep failed ({driver.returncode}):\n{err[-3000:]}")
        tables = results.load(root)
        # a trial's rounds table is written once, at its end (its trials row also when each
        # attempt starts)
        published = {path.split("/")[-1].removesuffix(".parquet"): count
                     for path, count in writes.per_path.items()
                     if path.startswith(f"{NAME}/tables/rounds/")}
        rounds = tables["rounds"].groupby("trial_id")["round"].apply(list)
        attempts_after = {t: results.read_trial(root, t)["attempts"] for t in finished_before}
    trial_ids = list(tables["trials"]["trial_id"])
    check = {
        "trials": trials, "per_tune_trial": args.per_tune_trial, "uptime_before": before,
        "uptime_at_kill": killed_at,
        "uptime_after": uptime(), "finished_before_kill": len(finished_before),
        "resumed_output_says": next((line for line in out.splitlines()
                                     if line.startswith("resuming:")), None),
        "trials_rows": len(trial_ids), "trials_unique": len(set(trial_ids)) == len(trial_ids),
        "every_status_ok": set(tables["trials"]["status"]) == {"ok"},
        "rounds_each_once": bool((rounds.map(sorted) == rounds.map(
            lambda r: list(range(1, EXPERIMENT["federation"]["rounds"] + 1)))).all()),
        "rounds_files_published": sum(published.values()),
        "rounds_published_more_than_once": sorted(t for t, n in published.items() if n > 1),
        "finished_before_kill_started_again": sorted(
            t for t in finished_before if attempts_after[t] != attempts_before[t]),
    }
    check["ok"] = (check["trials_rows"] == trials and check["trials_unique"]
                   and check["every_status_ok"] and check["rounds_each_once"]
                   and check["rounds_files_published"] == trials
                   and not check["rounds_published_more_than_once"]
                   and not check["finished_before_kill_started_again"])
    return check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--per-tune-trial", type=int, default=1, metavar="K",
                        help="the sweep's trials_per_tune_trial (trials one Tune trial runs)")
    parser.add_argument("--sample", type=int, default=50,
                        help="trials timed in process for the bound")
    parser.add_argument("--resume-check", type=int, metavar="N",
                        help="kill and resume a sweep of N trials; check each trial once")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="run in DIR and leave the storage there (default: a temporary one)")
    args = parser.parse_args(argv)
    result = resume_check(args) if args.resume_check else scaling(args)
    if args.resume_check:
        print(json.dumps(result, indent=2))
    else:
        print(table(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0 if result.get("ok", True) else 1


def table(result: dict) -> str:
    """The README's table: one row per size."""
    lines = ["| trials | process wall | bound | wall per extra trial (× bound's) | trial phase | "
             "Tune's end + compaction | leaderboard + report | driver peak RSS | Tune state "
             "file (experiments) | objects written per trial | load average before → after |",
             "|" + "---|" * 11]
    for r in result["records"]:
        extra = r.get("wall_per_extra_trial_s")
        extra = "-" if extra is None else \
            f"{extra * 1000:.1f} ms ({r['extra_trials_over_bound']:.1f}×)"
        objects = ", ".join(f"{k} {v:.2f}" for k, v in per_trial(r).items())
        load = [r[k].split("load average:")[-1].strip() for k in ("uptime_before", "uptime_after")]
        lines.append(
            f"| {r['trials']:,} | {r['process_s']:.1f} s | {r['bound_s']:.1f} s | {extra} | "
            f"{r['trial_phase_s']:.1f} s | {r['end_and_compaction_s']:.1f} s | "
            f"{r['report_s']:.1f} s | {r['driver_peak_rss_mb']:.0f} MB | "
            f"{r['tune_state_file_mb']:.1f} MB ({r['tune_experiments']}) | {objects} | "
            f"{load[0]} → {load[1]} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
