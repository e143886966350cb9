"""GPU check: the compute-heavy workload with 4 workers at 0.25 GPU each, per model.

    python benchmarks/gpu_check.py --out DIR [--rounds 10] [--models cnn,resnet18,...] [--quick]

Writes ``DIR/gpu_check.json``: machine, and per model of ``--models`` (the heavy workload's CNN,
or one of the papers' BatchNorm encoders on the same data: ``resnet18``, ``vgg16_cifar``,
``mobilenet_v2``) the floor on the same device (single process), and two raylf runs, the
sequential trainer (``cohort: off``) and lockstep cohorts (``--cohort``, auto by default), each
with per-round wall times (driver side) and their median after the first round, GPU utilization
and memory sampled with nvidia-smi every 0.5 s while it runs (null fields when there is no
nvidia-smi), peak worker memory and final accuracies; ``cohort_refused`` says why a worker of
the cohort run would still train one client at a time on this device (null: it trains in
cohorts), so a cohort row is never read as cohorts when it was not. On a machine without a GPU
it runs the same thing on the CPU (one logical GPU declared so the 0.25 shares schedule), so
the script is testable anywhere; ``--quick`` shrinks the workload for that. One model is sized
to finish well under 5 minutes on one GPU; ``--models cnn,resnet18,vgg16_cifar --rounds 6`` is
the prepared measurement of cohorts of BatchNorm models for a 15-minute device lease.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Ray starts its workers at niceness 15; the floor runs at 0. On a shared machine that alone
# would starve raylf (and Flower) against other users' processes: compare at equal priority.
os.environ.setdefault("RAY_worker_niceness", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks import workloads as W  # noqa: E402
from benchmarks.local_ray import warn_token_auth_off  # noqa: E402
from benchmarks.run import describe_machine  # noqa: E402
from raylf.experiment import run_experiment  # noqa: E402

MODELS = {  # the heavy workload's CNN and the papers' BatchNorm encoders, on its 3×32×32 images
    "cnn": W.HEAVY["model"],
    "resnet18": {"name": "resnet18"},
    "vgg16_cifar": {"name": "vgg16_cifar"},
    "mobilenet_v2": {"name": "mobilenet_v2"},
}


class GpuSampler:
    """Polls nvidia-smi (utilization %, memory MiB per GPU) in a background thread."""

    def __init__(self, interval: float = 0.5):
        self.exe = shutil.which("nvidia-smi")
        self.interval = interval
        self.samples: list[tuple[float, list[float], list[float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _poll(self) -> None:
        try:
            out = subprocess.run([self.exe, "--query-gpu=utilization.gpu,memory.used",
                                  "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            return
        util, mem = [], []
        for line in out.strip().splitlines():
            u, m = (float(v) for v in line.split(","))
            util.append(u)
            mem.append(m)
        if util:
            self.samples.append((time.time(), util, mem))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._poll()
            self._stop.wait(self.interval)

    def __enter__(self):
        if self.exe:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self.exe:
            self._thread.join()

    def summary(self) -> dict:
        if not self.samples:
            return {"nvidia_smi": self.exe, "util_mean_pct": None, "util_max_pct": None,
                    "mem_peak_mib": None, "samples": 0}
        util = np.array([s[1][0] for s in self.samples])
        mem = np.array([s[2][0] for s in self.samples])
        return {"nvidia_smi": self.exe, "util_mean_pct": float(util.mean()),
                "util_median_pct": float(np.median(util)), "util_max_pct": float(util.max()),
                "mem_peak_mib": float(mem.max()), "samples": len(self.samples)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    warn_token_auth_off()
    parser.add_argument("--out", required=True, help="directory for gpu_check.json")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--models", default="cnn",
                        help=f"comma-separated, of {', '.join(MODELS)}: the heavy workload's "
                             "CNN, or a BatchNorm encoder of the papers on its data")
    parser.add_argument("--cohort", default="auto",
                        help="resources.cohort of the cohort variant (auto, or clients per "
                             "lockstep batch); the sequential variant runs cohort: off")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CPU testing)")
    args = parser.parse_args(argv)
    import ray

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpus = torch.cuda.device_count()
    cores = os.cpu_count() or 2
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose from {', '.join(MODELS)}")
    cpus = min(2.0, (cores - 0.25) / args.workers)
    forced = int(args.cohort) if args.cohort.isdigit() else args.cohort
    result: dict = {"machine": describe_machine(), "physical_gpus": gpus,
                    "device": "cuda" if gpus else "cpu", "models": {}}
    ray.init(address="local", num_cpus=cores, num_gpus=max(gpus, 1), include_dashboard=False,
             logging_level="warning")
    try:
        for model in models:
            fields = {"federation__rounds": args.rounds, "eval_every": max(1, args.rounds // 2),
                      "model": MODELS[model]}
            if args.quick:
                fields.update(dataset__n_samples=800, federation__rounds=3, eval_every=3)
            result["models"][model] = check_model(fields, forced, args.workers, cpus, gpus)
    finally:
        ray.shutdown()
    path = out / "gpu_check.json"
    path.write_text(json.dumps(result, indent=1, default=str))
    summary = {model: {"floor_round_s": r["floor"]["round_s_median"],
                       "cohort_refused": r["cohort_refused"],
                       **{v: {k: r[v].get(k) for k in ("round_s_median", "ratio_to_floor",
                                                        "gpu_util_mean_pct", "status")}
                          for v in ("sequential", "cohort")}}
               for model, r in result["models"].items()}
    print(json.dumps({"device": result["device"], "json": str(path), "models": summary},
                     indent=1))
    return 0 if all(r[v]["status"] == "ok" for r in result["models"].values()
                    for v in ("sequential", "cohort")) else 1


def check_model(fields: dict, cohort, workers: int, cpus: float, gpus: int) -> dict:
    """One model's floor, sequential run and cohort run, and why its workers would refuse
    cohorts on this device (None: they train in cohorts)."""
    from raylf.runtime import Blueprint
    from raylf.training.cohort import not_worthwhile, unsupported_reason

    device = "cuda" if gpus else "cpu"
    spec = W.make_spec(W.HEAVY, workers=workers, cpus_per_worker=cpus, gpus_per_worker=0.25,
                       **fields)
    blueprint = Blueprint(spec, W.build_federation(spec))
    model = blueprint.build_model()  # on the CPU: the rules read its layers and the device type
    refused = unsupported_reason(model)
    if refused is None and cohort == "auto":
        refused = not_worthwhile(model, tuple(blueprint.federation.input_shape),
                                 torch.device(device))
    report: dict = {"spec": spec.to_dict(), "cohort_refused": refused}
    t0 = time.perf_counter()
    floor = W.floor_run(spec, device=device)
    report["floor"] = {"round_s": floor["round_s"],
                       "round_s_median": W.median_after_first(floor["round_s"]),
                       "wall_s": time.perf_counter() - t0}
    report["driver_floor_max_memory_allocated_mib"] = (
        torch.cuda.max_memory_allocated() / 2**20 if gpus else None)
    if gpus:  # the workers get the memory the floor held, and the next model's floor its own peak
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    for variant, setting in (("sequential", "off"), ("cohort", cohort)):
        spec = W.make_spec(W.HEAVY, workers=workers, cpus_per_worker=cpus, gpus_per_worker=0.25,
                           cohort=setting, **fields)
        report[variant] = measure(spec, floor, workers, cpus)
        if report[variant]["round_s_median"]:
            report[variant]["ratio_to_floor"] = (report[variant]["round_s_median"]
                                                 / report["floor"]["round_s_median"])
    return report


def measure(spec, floor: dict, workers: int, cpus: float) -> dict:
    """One raylf run on Ray: per-round driver wall times, GPU utilization while it ran, and how
    far its final per-client accuracies are from the floor's."""
    stamps: list[float] = []
    coord: list[float] = []
    with GpuSampler() as sampler:
        t0 = time.perf_counter()
        res = run_experiment(spec, backend="ray", reraise=True,
                             on_round=lambda o, r, p, s: (stamps.append(time.perf_counter()),
                                                       coord.append(o.record["round_s"])))
        wall = time.perf_counter() - t0
    per_round = list(np.diff(stamps))
    last = spec.federation.rounds
    accs = [r["accuracy"] for r in res.tables["clients"] if r["round"] == last]
    diff = max((abs(a - b) for a, b in zip(accs, floor["final_acc_per_client"])
                if a is not None and b is not None), default=None)
    gpu = sampler.summary()
    return {"status": res.status, "cohort": spec.resources.cohort, "workers": workers,
            "gpus_per_worker": 0.25, "cpus_per_worker": cpus, "round_s": per_round,
            "round_s_median": float(np.median(per_round)) if per_round else None,
            "coordinator_round_s": coord, "wall_s": wall, "acc_mean": res.trial.get("acc_mean"),
            "max_acc_diff_vs_floor": diff, "gpu": gpu,
            "gpu_util_mean_pct": gpu.get("util_mean_pct"),
            "worker_peak_mb": max((r.get("worker_peak_mb") or 0 for r in res.tables["rounds"]),
                                  default=None)}


if __name__ == "__main__":
    sys.exit(main())
