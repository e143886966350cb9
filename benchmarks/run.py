"""raylf performance harness: ``python benchmarks/run.py [--quick] [--out DIR]``.

Sections (see benchmarks/README.md):

1. overhead — the same experiment as the floor (a plain single-process PyTorch loop), raylf's
   in-process backend and raylf on Ray with 1 and 2 workers; tiny and compute-heavy workloads;
   plus a phase breakdown (dispatch, fit, per-client loop, aggregation, evaluation).
2. scaling — seconds per round and peak Σ RSS for 100 / 1,000 / 10,000 virtual clients at a fixed
   number of participants per round.
3. flower — Flower's simulation on the identical workload (skipped in --quick, or when the
   Flower venv is missing).
4. pfl — Apple's pfl-research simulator on the identical tiny and heavy workloads, beside the
   floor and raylf measured in the same section (skipped in --quick, or when the pfl venv is
   missing).

Writes ``results.json``, ``results.parquet`` and ``results.md`` under ``--out`` and prints the
markdown table. Per-round times are medians over rounds after the first, then the median over
repeats.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# Ray workers unpickle benchmark classes by reference: give them the repository on their path.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Ray starts its workers at niceness 15; the floor runs at 0. On a shared machine that alone
# would starve raylf (and Flower) against other users' processes: compare at equal priority.
os.environ.setdefault("RAY_worker_niceness", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from benchmarks import workloads as W  # noqa: E402
from benchmarks.local_ray import warn_token_auth_off  # noqa: E402
from raylf.data.federation import build_federation  # noqa: E402
from raylf.experiment import run_experiment  # noqa: E402
from raylf.runtime.blueprint import Blueprint  # noqa: E402
from raylf.runtime.coordinator import Coordinator  # noqa: E402


@dataclass(frozen=True)
class Peer:
    """Another FL framework run on the exported workload, in its own venv (``setup``)."""

    section: str   # the --sections name and the rows' section
    venv: str      # benchmarks/<venv>, git-ignored
    script: str    # benchmarks/<script>: --workload W.npz --out R.json [args]
    setup: str     # benchmarks/<setup>: the command that builds the venv
    version: str   # the field of the script's JSON holding the framework's version

    @property
    def python(self) -> Path:
        return ROOT / "benchmarks" / self.venv / "bin" / "python"


FLOWER = Peer("flower", ".flower-venv", "flower_side.py", "setup_peer_venv.sh flower",
              "flwr_version")
PFL = Peer("pfl", ".pfl-venv", "pfl_side.py", "setup_peer_venv.sh pfl", "pfl_version")
COLUMNS = [
    "section", "workload", "variant", "clients", "participants", "rounds", "workers", "repeats",
    "round_s", "round_s_mean", "ratio_to_floor", "coord_round_s", "wall_s", "acc_mean",
    "max_acc_diff_vs_floor", "balance_bound", "parallel_bound", "peak_rss_gib",
    "peak_rss_all_gib", "peak_pss_gib",
    "dispatch_s", "fit_s", "client_loop_s", "aggregate_s", "evaluate_s", "other_s",
    "startup_s", "ratio_to_10k", "note",
]


# --------------------------------------------------------------------------- environment


def describe_machine() -> dict[str, Any]:
    import ray

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                             capture_output=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, text=True, capture_output=True, timeout=5).stdout.strip()
        sha = f"{sha}{'+dirty' if dirty else ''}"
    except (OSError, subprocess.SubprocessError):
        sha = "unknown"
    return {
        "cpu": cpu, "cores": os.cpu_count(),
        "ram_gib": round(W.psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(), "torch": torch.__version__, "ray": ray.__version__,
        "git_sha": sha, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch_threads_driver": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
    }


def start_ray() -> None:
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=os.cpu_count(), num_gpus=0, include_dashboard=False,
                 logging_level="warning", object_store_memory=400 * 2**20)


def stop_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


# --------------------------------------------------------------------------- measurements


def ray_resources(workers: int) -> dict[str, Any]:
    """Worker CPUs so that coordinator (0.25) + workers fit the machine; 1 torch thread each."""
    cores = os.cpu_count() or 2
    return {"workers": workers, "cpus_per_worker": min(1.0, (cores - 0.25) / workers)}


def measure_raylf(base: dict, backend: str, workers: int, *, sampler: bool = False,
                  startup: bool = False, **overrides) -> dict[str, Any]:
    res = ray_resources(workers) if backend == "ray" else {"workers": workers}
    spec = W.make_spec(base, **res, **overrides)
    stamps: list[float] = []
    coord: list[float] = []

    def hook(outcome, runtime, progress, snapshot):
        stamps.append(time.perf_counter())
        coord.append(outcome.record["round_s"])

    rss = W.RssSampler() if sampler else None
    t0 = time.perf_counter()
    if rss:
        rss.__enter__()
    try:
        result = run_experiment(spec, backend=backend, on_round=hook, reraise=True)
    finally:
        if rss:
            rss.__exit__(None, None, None)
    wall = time.perf_counter() - t0
    if result.status != "ok":
        raise RuntimeError(f"{backend} run ended {result.status}: {result.error}")
    last = spec.federation.rounds
    per_round = list(np.diff(stamps)) if len(stamps) > 1 else [wall]
    if startup:  # the clients table of a million clients is not worth keeping per client
        return {"round_s": float(np.median(per_round)), "wall_s": wall,
                "startup_s": stamps[0] - t0 - coord[0], "acc_mean": result.trial.get("acc_mean"),
                "peak_rss_gib": rss.peak_workers / 2**30, "peak_rss_all_gib": rss.peak_all / 2**30,
                "peak_pss_gib": rss.peak_pss / 2**30, "rss_breakdown_mib": rss.breakdown}
    accs = {r["client_id"]: r["accuracy"] for r in result.tables["clients"]
            if r["round"] == last and r["task"] == "main"}
    out = {
        "round_s": float(np.median(per_round)), "round_s_mean": float(np.mean(per_round)),
        "coord_round_s": W.median_after_first(coord), "wall_s": wall,
        "acc": [accs.get(k) for k in range(spec.federation.num_clients)],
        "acc_mean": result.trial.get("acc_mean"),
        "balance_bound": W.balance_bound(spec) if workers > 1 else 1.0,
    }
    if rss:
        out["peak_rss_gib"] = rss.peak_workers / 2**30
        out["peak_rss_all_gib"] = rss.peak_all / 2**30
        out["peak_pss_gib"] = rss.peak_pss / 2**30
        out["rss_breakdown_mib"] = rss.breakdown
    return out


def measure_floor(base: dict, torch_seed: bool = False, raylf_layout: bool = False,
                  **overrides) -> dict[str, Any]:
    spec = W.make_spec(base, **overrides)
    t0 = time.perf_counter()
    run = W.floor_run(spec, torch_seed=torch_seed, raylf_layout=raylf_layout)
    wall = time.perf_counter() - t0
    accs = [a for a in run["final_acc_per_client"] if a is not None]
    return {"round_s": W.median_after_first(run["round_s"]),
            "round_s_mean": float(np.mean(run["round_s"][1:] or run["round_s"])),
            "wall_s": wall, "acc": run["final_acc_per_client"], "acc_mean": float(np.mean(accs))}


def _floor_beside_another(base: dict, raylf_layout: bool, barrier, results) -> None:
    torch.set_num_threads(1)
    barrier.wait()  # both copies start together, so their timed rounds overlap
    results.put(measure_floor(base, raylf_layout=raylf_layout))


def measure_floor_pair(base: dict, raylf_layout: bool) -> list[dict[str, Any]]:
    """The floor in two processes at once (spawned, one torch thread each): what a second busy
    process costs each one on this machine. Two workers cannot beat this, whatever raylf does.
    It depends on the host: two 1-thread heavy step loops on this VM's two vCPUs ran 9.3 →
    13.8 ms per step each at one time and 9.1 → 10.1 ms a little later."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    copies = [context.Process(target=_floor_beside_another,
                              args=(base, raylf_layout, barrier, results)) for _ in range(2)]
    for copy in copies:
        copy.start()
    runs = [results.get(timeout=1800) for _ in copies]
    for copy in copies:
        copy.join()
    return runs


def repeat(fn, times: int) -> dict[str, Any]:
    return summarize([fn() for _ in range(times)])


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    times = len(runs)
    best = dict(runs[0])
    for key in ("round_s", "round_s_mean", "coord_round_s", "wall_s", "peak_rss_gib",
                "peak_rss_all_gib", "peak_pss_gib"):
        if key in best:
            best[key] = float(np.median([r[key] for r in runs]))
    best["repeats"] = times
    return best


def max_diff(a: list, b: list) -> float:
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    return float(max((abs(x - y) for x, y in pairs), default=float("nan")))


def phase_probe(base: dict, backend: str, workers: int, **overrides) -> dict[str, float]:
    """Drive a Coordinator from this process with timed shards and time each phase."""
    import ray

    from raylf.runtime.local import LocalPool
    from raylf.runtime.ray_backend import RayPool

    res = ray_resources(workers) if backend == "ray" else {"workers": workers}
    spec = W.make_spec(base, **res, **overrides)
    bp = Blueprint(spec, build_federation(spec))
    actors = []
    if backend == "local":
        pool = LocalPool([W.TimedShard(bp, ids) for ids in bp.hosted()])
    else:
        cls = ray.remote(W.TimedRayShard)
        threads = spec.resources.threads_per_worker()
        actors = [cls.options(num_cpus=spec.resources.cpus_per_worker).remote(bp, ids, threads)
                  for ids in bp.hosted()]
        pool = RayPool(actors, 600.0)
    try:
        clock = W.PhaseClock(Coordinator(bp, pool))
        for rnd in range(1, spec.federation.rounds + 1):
            clock.run_round(rnd)
    finally:
        for a in actors:
            ray.kill(a, no_restart=True)
    return clock.medians()


# --------------------------------------------------------------------------- sections


def row(section: str, workload: str, variant: str, spec_base: dict, **fields) -> dict[str, Any]:
    fed = spec_base["federation"]
    r = dict.fromkeys(COLUMNS)
    r.update(section=section, workload=workload, variant=variant, clients=fed["num_clients"],
             participants=max(1, round(fed["participation"] * fed["num_clients"])),
             rounds=fed["rounds"])
    r.update({k: v for k, v in fields.items() if k in COLUMNS})
    return r


def overhead_section(quick: bool, log, workloads: tuple[str, ...] = ("tiny", "w1", "heavy")
                     ) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    reps = 1 if quick else 3
    bases = {"tiny": dict(W.TINY), "w1": dict(W.W1), "heavy": dict(W.HEAVY)}
    if quick:
        for name in ("tiny", "w1"):
            bases[name] = W.with_fields(bases[name], federation__rounds=4, eval_every=2)
        bases["heavy"] = W.with_fields(bases["heavy"], dataset__n_samples=600,
                                       federation__rounds=2, eval_every=2)
    for name, base in ((name, bases[name]) for name in workloads):
        n_rep = reps
        # resources.cohort: auto (the default: lockstep cohorts where they pay, see
        # raylf.training.cohort), off (one client after another, the pre-cohort trainer), and on
        # the heavy CNN cohorts forced, which auto declines on a CPU
        variants = [("local", "local", 1, "auto"), ("local-seq", "local", 1, "off"),
                    ("ray-1w", "ray", 1, "auto"), ("ray-2w", "ray", 2, "auto"),
                    ("ray-2w-seq", "ray", 2, "off")]
        if name == "heavy":
            variants.append(("local-cohort-forced", "local", 1, 10))
        if quick:  # each Ray run starts fresh actors: keep the smoke short
            keep = ("local", "ray-1w", "ray-2w") if name == "heavy" else (
                "local", "local-seq", "ray-1w", "ray-2w")
            variants = [v for v in variants if v[0] in keep]
        # Repeats interleave the variants (floor, local, ray-1w, ray-2w, floor, …) so that a
        # change in the machine's load hits all of them; ratios are taken within a repeat.
        # Where raylf's CPU trainer rewrites the model (channels-last, pools before ReLUs),
        # the floor with the same rewrites is the reference for equal arithmetic
        # (max_acc_diff_vs_floor); the plain floor, what a hand-written loop does, stays the
        # reference for speed.
        same_layout = W.trains_channels_last(W.make_spec(base))
        runs: dict[str, list[dict[str, Any]]] = {"floor": [], "floor-torch-seed": [],
                                                 "floor-raylf-layout": [], "floor-pair": []}
        pair = name == "heavy"  # where the workers' arithmetic, not Ray's calls, sets the pace
        for _ in range(n_rep):
            runs["floor"].append(measure_floor(base))
            if same_layout:
                runs["floor-raylf-layout"].append(measure_floor(base, raylf_layout=True))
            if pair:  # the arithmetic raylf's workers do: the floor on their layout
                runs["floor-pair"].append(summarize(measure_floor_pair(base, same_layout)))
            if not quick:
                runs["floor-torch-seed"].append(measure_floor(base, torch_seed=True))
            for variant, backend, workers, cohort in variants:
                runs.setdefault(variant, []).append(
                    measure_raylf(base, backend, workers, cohort=cohort))
        floor = summarize(runs["floor"])
        log(f"[{name}] floor {floor['round_s']:.4f} s/round")
        rows.append(row("overhead", name, "floor", base, workers=1, ratio_to_floor=1.0,
                        max_acc_diff_vs_floor=0.0, note="plain PyTorch loop, 1 thread", **floor))
        if runs["floor-torch-seed"]:
            usual = summarize(runs["floor-torch-seed"])
            ratio = float(np.median([u["round_s"] / f["round_s"] for u, f
                                     in zip(runs["floor-torch-seed"], runs["floor"])]))
            log(f"[{name}] floor-torch-seed {usual['round_s']:.4f} s/round ({ratio:.2f}x floor)")
            rows.append(row("overhead", name, "floor-torch-seed", base, workers=1,
                            ratio_to_floor=ratio, note="the floor seeding with torch.manual_seed",
                            max_acc_diff_vs_floor=max(max_diff(u["acc"], f["acc"]) for u, f in
                                                      zip(runs["floor-torch-seed"], runs["floor"])),
                            **usual))
        reference = runs["floor-raylf-layout"] if same_layout else runs["floor"]
        slowdown = None
        if runs["floor-pair"]:
            slowdown = float(np.median([p["round_s"] / f["round_s"]
                                        for p, f in zip(runs["floor-pair"], reference)]))
            paired = summarize(runs["floor-pair"])
            log(f"[{name}] floor-pair {paired['round_s']:.4f} s/round "
                f"({slowdown:.2f}x the same floor alone)")
            rows.append(row("overhead", name, "floor-pair", base, workers=2,
                            ratio_to_floor=slowdown,
                            note="two floors on raylf's layout at once: each one's round over "
                                 "that floor's alone",
                            max_acc_diff_vs_floor=max(max_diff(p["acc"], f["acc"]) for p, f in
                                                      zip(runs["floor-pair"], reference)),
                            **paired))
        if same_layout:
            layout = summarize(runs["floor-raylf-layout"])
            ratio = float(np.median([c["round_s"] / f["round_s"] for c, f
                                     in zip(runs["floor-raylf-layout"], runs["floor"])]))
            log(f"[{name}] floor-raylf-layout {layout['round_s']:.4f} s/round "
                f"({ratio:.2f}x floor)")
            rows.append(row("overhead", name, "floor-raylf-layout", base, workers=1,
                            ratio_to_floor=ratio,
                            note="the floor on raylf's CPU layout; acc diff: vs the plain floor",
                            max_acc_diff_vs_floor=max(max_diff(c["acc"], f["acc"]) for c, f in
                                                      zip(runs["floor-raylf-layout"],
                                                          runs["floor"])),
                            **layout))
        ratios: dict[str, float] = {}
        for variant, _backend, workers, _cohort in variants:
            m = summarize(runs[variant])
            ratio = ratios[variant] = float(np.median([r["round_s"] / f["round_s"]
                                                       for r, f in zip(runs[variant],
                                                                       runs["floor"])]))
            # the best two workers can do here: one worker's pace, the busiest worker's share
            # of the samples, and the machine's cost of a second busy process
            bound = ratios["ray-1w"] * m["balance_bound"] * slowdown \
                if variant == "ray-2w" and slowdown and "ray-1w" in ratios else None
            log(f"[{name}] {variant} {m['round_s']:.4f} s/round ({ratio:.2f}x floor"
                + (f", parallel bound {bound:.2f}x)" if bound else ")"))
            rows.append(row("overhead", name, variant, base, workers=workers,
                            ratio_to_floor=ratio, parallel_bound=bound,
                            max_acc_diff_vs_floor=max(max_diff(r["acc"], f["acc"]) for r, f
                                                      in zip(runs[variant], reference)),
                            **m))
        probes = [("local", "local", 1), ("ray-1w", "ray", 1), ("ray-2w", "ray", 2)]
        if quick:
            probes = [("local", "local", 1)] if name == "tiny" else []
        elif name == "w1":  # tiny's phases tell the same story
            probes = []
        for variant, backend, workers in probes:
            ph = phase_probe(base, backend, workers)
            log(f"[{name}] phases {variant}: " + ", ".join(f"{k} {v:.4f}" for k, v in ph.items()))
            rows.append(row("phases", name, variant, base, workers=workers,
                            note="driver-side coordinator with timed shards; medians",
                            **ph))
    return rows


def scaling_section(quick: bool, log) -> list[dict[str, Any]]:
    rows = []
    sizes, participants, rounds = ((100, 1000), 10, 3) if quick else ((100, 1000, 10000), 100, 5)
    for n in sizes:
        base = W.scaling_spec(n, participants, rounds)
        if not quick:  # a fresh Ray per size, so idle workers of earlier runs do not count
            stop_ray()
            start_ray()
        workers = 1 if quick else 2
        m = measure_raylf(base, "ray", workers, sampler=True)
        log(f"[scaling] {n} clients: {m['round_s']:.3f} s/round, "
            f"peak RSS {m['peak_rss_gib']:.2f} GiB (all {m['peak_rss_all_gib']:.2f} GiB, "
            f"PSS {m['peak_pss_gib']:.2f} GiB)")
        rows.append(row("scaling", f"synthetic-{n}", f"ray-{workers}w", base, workers=workers,
                        repeats=1,
                        note="MiB RSS at peak: " + ", ".join(
                            f"{k} {v}" for k, v in m["rss_breakdown_mib"].items()), **m))
    return rows


def measure_in_fresh_driver(base: dict) -> dict[str, Any]:
    """``measure_raylf`` on 2 Ray workers with memory sampling, in a new driver process with its
    own Ray: what a user's ``python -m raylf.run`` starts from, so neither the data earlier
    sections left in this process nor their idle Ray workers count."""
    torch.set_num_threads(1)
    start_ray()
    try:
        return measure_raylf(base, "ray", 2, sampler=True, startup=True)
    finally:
        stop_ray()


def million_section(log) -> list[dict[str, Any]]:
    """tune/examples/synthetic_1m.yaml (1,000,000 clients of 10 samples, 100 per round, 2
    workers) next to the same spec with 10,000 clients: per-round cost must not grow with the
    registered clients; start-up (partition, shards, actors) and memory of all processes."""
    spec = yaml.safe_load((ROOT / "tune" / "examples" / "synthetic_1m.yaml").read_text())
    rows, per_round = [], {}
    stop_ray()
    for n in (10_000, 1_000_000):
        base = W.with_fields(spec, federation__num_clients=n,
                             federation__participation=100 / n,
                             dataset__n_samples=spec["dataset"]["n_samples"] // 1_000_000 * n)
        base.pop("resources")
        with multiprocessing.get_context("spawn").Pool(1) as driver:
            m = driver.apply(measure_in_fresh_driver, (base,))
        per_round[n] = m["round_s"]
        log(f"[million] {n} clients: {m['round_s']:.3f} s/round, start-up "
            f"{m['startup_s']:.1f} s, all processes {m['peak_rss_all_gib']:.2f} GiB RSS "
            f"(PSS {m['peak_pss_gib']:.2f} GiB)")
        rows.append(row("million", f"synthetic-{n}", "ray-2w", base, workers=2, repeats=1,
                        ratio_to_10k=m["round_s"] / per_round[10_000],
                        note=f"start-up {m['startup_s']:.1f} s; MiB RSS at peak: " + ", ".join(
                            f"{k} {v}" for k, v in m["rss_breakdown_mib"].items()), **m))
    start_ray()
    return rows


@contextmanager
def exported(spec) -> Iterator[Path]:
    """The spec's workload as a peer's ``.npz`` (``workloads.export_npz``) in a temporary
    folder."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "workload.npz"
        W.export_npz(spec, path, cpus_per_client=1.0)
        yield path


def run_peer(peer: Peer, workload: Path, *args: str) -> dict[str, Any]:
    """The peer's script on an exported workload, in the peer's venv, without this process's
    PYTHONPATH (the peer must not see raylf); its JSON plus ``outer_s``, the subprocess's wall
    (interpreter start, imports, set-up and the run)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{peer.section}.json"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        t0 = time.perf_counter()
        subprocess.run([str(peer.python), str(ROOT / "benchmarks" / peer.script),
                        "--workload", str(workload), "--out", str(out), *args],
                       check=True, env=env, cwd=ROOT, timeout=1800)
        result = json.loads(out.read_text())
    result["outer_s"] = time.perf_counter() - t0
    return result


def peer_row(peer: Peer, results: list[dict[str, Any]], workload: str, base: dict,
             references: list[dict[str, Any]], *, workers: int, note: str,
             suffix: str = "") -> dict[str, Any]:
    """One row for a peer's runs (one per repeat), variant "<section> <version><suffix>":
    ``round_s`` is the median over runs of each run's median round after the first;
    ``ratio_to_floor`` the median over runs of that round over the paired reference's
    ``round_s``; ``max_acc_diff_vs_floor`` the largest per-client difference of final accuracies
    from the paired reference's ``acc``."""
    rounds = [W.median_after_first(r["round_s"]) for r in results]
    variant = f"{peer.section} {results[0][peer.version]}{suffix}"
    return row(peer.section, workload, variant, base, workers=workers, repeats=len(results),
               round_s=float(np.median(rounds)),
               round_s_mean=float(np.median([np.mean(r["round_s"][1:]) for r in results])),
               wall_s=float(np.median([r["wall_s"] for r in results])),
               acc_mean=results[0]["acc_mean"],
               ratio_to_floor=float(np.median([t / ref["round_s"]
                                               for t, ref in zip(rounds, references)])),
               max_acc_diff_vs_floor=max(max_diff(ref["acc"], r["final_acc_per_client"])
                                         for r, ref in zip(results, references)),
               note=note)


PEER_WORKLOADS = (("tiny", W.TINY), ("w1", W.W1), ("heavy", W.HEAVY))


def flower_section(log) -> list[dict[str, Any]]:
    """Flower's simulation on each workload (evaluation in the last round only), once, beside
    raylf on Ray with 2 workers (3 runs); the ratio column is Flower's round over raylf's."""
    rows: list[dict[str, Any]] = []
    for name, full in PEER_WORKLOADS:
        base = W.with_fields(full, eval_every=full["federation"]["rounds"])
        with exported(W.make_spec(base)) as path:
            stop_ray()  # Flower starts its own Ray: do not leave ours idling on the same cores
            fl = run_peer(FLOWER, path, "--num-cpus", str(os.cpu_count()))
        start_ray()
        ours = repeat(lambda base=base: measure_raylf(base, "ray", 2), 3)
        fl_round = W.median_after_first(fl["round_s"])
        diff = max_diff(ours["acc"], fl["final_acc_per_client"])
        log(f"[flower] [{name}] flower {fl_round:.4f} s/round, raylf {ours['round_s']:.4f} "
            f"s/round; acc flower {fl['acc_mean']:.4f} raylf {ours['acc_mean']:.4f} "
            f"(max diff {diff:.2g})")
        rows += [
            peer_row(FLOWER, [fl], name, base, [ours], workers=2,
                     note=(f"ray {fl['ray_version']}, 1 CPU/client; ratio column = "
                           f"flower/raylf per round; wall = run_simulation incl. Ray start "
                           f"({fl['outer_s']:.1f}s with process start)")),
            row("flower", name, "raylf ray-2w", base, workers=2,
                ratio_to_floor=1.0, max_acc_diff_vs_floor=diff,
                note=f"flower/raylf total wall {fl['wall_s'] / ours['wall_s']:.1f}x "
                     "(raylf wall excludes ray.init, Ray already running)", **ours)]
    return rows


PFL_UNEQUAL = (
    "not equal: pfl builds a client's data when it is sampled, averages float32 model "
    "differences (floor, raylf: float64 sums of weights), evaluates round 1's clients on their "
    "training data")


def pfl_section(log) -> list[dict[str, Any]]:
    """pfl on the tiny, W1 and heavy workloads (evaluation in the last round only) with 1
    process and with 2 (torchrun), one torch thread each, beside the floor, raylf local and
    raylf on Ray with 2 workers. Each repeat (3, heavy 2) runs all five in turn, so that a
    change in the machine's load hits all of them; ratios are taken within a repeat."""
    rows: list[dict[str, Any]] = []
    for name, full in PEER_WORKLOADS:
        reps = 2 if name == "heavy" else 3
        base = W.with_fields(full, eval_every=full["federation"]["rounds"])
        spec = W.make_spec(base)
        same_layout = W.trains_channels_last(spec)
        runs: dict[str, list[dict[str, Any]]] = {
            "floor": [], "pfl-1p": [], "local": [], "pfl-2p": [], "ray-2w": []}
        with exported(spec) as path:
            for _ in range(reps):
                runs["floor"].append(measure_floor(base))
                runs["pfl-1p"].append(run_peer(PFL, path, "--processes", "1", "--threads", "1"))
                runs["local"].append(measure_raylf(base, "local", 1))
                runs["pfl-2p"].append(run_peer(PFL, path, "--processes", "2", "--threads", "1"))
                runs["ray-2w"].append(measure_raylf(base, "ray", 2))
        floor = summarize(runs["floor"])
        log(f"[pfl] [{name}] floor {floor['round_s']:.4f} s/round")
        rows.append(row("pfl", name, "floor", base, workers=1, ratio_to_floor=1.0,
                        max_acc_diff_vs_floor=0.0,
                        note="plain PyTorch loop, 1 thread; evaluation in the last round only",
                        **floor))
        for variant, workers in (("local", 1), ("ray-2w", 2)):
            m = summarize(runs[variant])
            ratio = float(np.median([r["round_s"] / f["round_s"]
                                     for r, f in zip(runs[variant], runs["floor"])]))
            layout = " (on raylf's channels-last CNN layout: acc diff is float rounding)" \
                if same_layout else ""
            rows.append(row("pfl", name, f"raylf {variant}", base, workers=workers,
                            ratio_to_floor=ratio,
                            max_acc_diff_vs_floor=max(max_diff(r["acc"], f["acc"]) for r, f
                                                      in zip(runs[variant], runs["floor"])),
                            note=f"raylf, cohort auto{layout}", **m))
            log(f"[pfl] [{name}] raylf {variant} {m['round_s']:.4f} s/round ({ratio:.2f}x floor)")
        for processes, ours in ((1, "local"), (2, "ray-2w")):
            results = runs[f"pfl-{processes}p"]
            over_ours = float(np.median([W.median_after_first(p["round_s"]) / r["round_s"]
                                         for p, r in zip(results, runs[ours])]))
            outer = float(np.median([p["outer_s"] for p in results]))
            rows.append(peer_row(
                PFL, results, name, base, runs["floor"], workers=processes,
                suffix=f" {processes}p",
                note=(f"{processes} process{'es (torchrun, gloo)' if processes > 1 else ''}, "
                      f"1 torch thread each; pfl/raylf {ours} per round {over_ours:.2f}x; "
                      f"wall = algorithm.run ({outer:.1f}s with process start, data loading, "
                      f"final evaluation); {PFL_UNEQUAL}"
                      + ("; pfl and the floor train the plain NCHW CNN" if same_layout
                         else ""))))
            r = rows[-1]
            log(f"[pfl] [{name}] pfl {processes}p {r['round_s']:.4f} s/round "
                f"({r['ratio_to_floor']:.2f}x floor, {over_ours:.2f}x raylf {ours}); acc "
                f"{r['acc_mean']:.4f} vs floor {floor['acc_mean']:.4f} "
                f"(max diff {r['max_acc_diff_vs_floor']:.2g})")
    return rows


# --------------------------------------------------------------------------- output


def markdown(rows: list[dict[str, Any]], machine: dict[str, Any]) -> str:
    def fmt(v):
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return ""
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    lines = ["machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()), ""]
    for section, cols in (
        ("overhead", ["workload", "variant", "workers", "repeats", "round_s", "round_s_mean",
                      "ratio_to_floor", "balance_bound", "parallel_bound", "coord_round_s",
                      "wall_s", "acc_mean", "max_acc_diff_vs_floor"]),
        ("phases", ["workload", "variant", "round_s", "dispatch_s", "fit_s", "client_loop_s",
                    "aggregate_s", "evaluate_s", "other_s"]),
        ("scaling", ["workload", "clients", "participants", "round_s", "peak_rss_gib",
                     "peak_rss_all_gib", "peak_pss_gib", "wall_s", "note"]),
        ("million", ["workload", "clients", "participants", "round_s", "ratio_to_10k",
                     "startup_s", "peak_rss_all_gib", "peak_pss_gib", "wall_s", "note"]),
        ("flower", ["workload", "variant", "round_s", "round_s_mean", "ratio_to_floor", "wall_s",
                    "acc_mean", "max_acc_diff_vs_floor", "note"]),
        ("pfl", ["workload", "variant", "workers", "repeats", "round_s", "round_s_mean",
                 "ratio_to_floor", "wall_s", "acc_mean", "max_acc_diff_vs_floor", "note"]),
    ):
        part = [r for r in rows if r["section"] == section]
        if not part:
            continue
        lines += [f"### {section}", "", "| " + " | ".join(cols) + " |",
                  "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in part]
        lines.append("")
    return "\n".join(lines)


def write(rows: list[dict[str, Any]], machine: dict[str, Any], out_dir: Path) -> str:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_dir.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows, columns=COLUMNS)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.replace_schema_metadata({"machine": json.dumps(machine)})
    pq.write_table(table, out_dir / "results.parquet")
    (out_dir / "results.json").write_text(json.dumps({"machine": machine, "rows": rows},
                                                     indent=1, default=float))
    md = markdown(rows, machine)
    (out_dir / "results.md").write_text(md + "\n")
    return md


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    warn_token_auth_off()
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, one repeat, no peers: Flower, pfl (the smoke test)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--sections", default="overhead,scaling,million,flower,pfl",
                        help="comma list of overhead, scaling, million, flower, pfl")
    parser.add_argument("--workloads", default="tiny,w1,heavy",
                        help="comma list of the overhead section's workloads: tiny, w1 "
                             "(issue 32's: tiny with batch 32, no momentum), heavy")
    args = parser.parse_args(argv)
    sections = set(args.sections.split(","))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # the floor and the in-process backend: one core's arithmetic

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    machine = describe_machine()
    rows: list[dict[str, Any]] = []
    start_ray()
    try:
        if "overhead" in sections:
            rows += overhead_section(args.quick, log, tuple(args.workloads.split(",")))
        if "scaling" in sections:
            rows += scaling_section(args.quick, log)
        if "million" in sections and not args.quick:
            rows += million_section(log)
        peers: list[tuple[Peer, Callable[[], list[dict[str, Any]]]]] = [
            (FLOWER, lambda: flower_section(log)),
            (PFL, lambda: pfl_section(log))]
        for peer, section in peers:
            if peer.section not in sections:
                continue
            if args.quick:
                log(f"[{peer.section}] skipped: --quick leaves the peer frameworks out")
                continue
            if not peer.python.exists():
                log(f"[{peer.section}] skipped: no {peer.section} venv at {peer.python} "
                    f"(benchmarks/{peer.setup})")
                continue
            try:
                rows += section()
            except (subprocess.SubprocessError, OSError, RuntimeError, ValueError) as err:
                log(f"[{peer.section}] failed: {err!r}")
                start_ray()
    finally:
        stop_ray()
    machine["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(write(rows, machine, out_dir))
    print(f"\nresults: {out_dir}/results.{{parquet,json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
