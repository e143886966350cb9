"""Cohorts of BatchNorm models on this machine: rounds trained one client at a time against the
same rounds trained in lockstep cohorts, in this process, on one torch thread (as a Ray worker of
one CPU trains).

    python benchmarks/cohort_batchnorm.py [--rounds 4] [--samples 4000] [--out /tmp/bn.json]

The workload is the heavy one's federation (``workloads.HEAVY``: 20 clients, 10 per round, local
SGD with momentum, batch 32) on fewer synthetic 3×32×32 images, one worker; the models are small
members of the papers' BatchNorm families — VGG16-CIFAR at 1/8 width (BatchNorm and dropout after
every convolution, trained layer by layer in cohorts) and MobileNetV2 at 0.25 width (BatchNorm,
dropout, trained under ``vmap``) — and the FMT-SVM CNN without BatchNorm for reference. Each
model runs ``cohort: off`` and cohorts of the round's participants (forced: ``auto`` keeps all
three one client at a time on a CPU for their convolutions). Printed and written (``--out``,
JSON) per model: the median round time after the first (driver side, the last round's
evaluation included), the cohort's time over the sequential one, and the largest difference of
a client's final accuracy between the two (deep BatchNorm stacks amplify float rounding, so it
need not be 0). The machine's load average is read before and after: on a shared machine the
ratio within a model is what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks import workloads as W  # noqa: E402
from raylf.experiment import run_experiment  # noqa: E402

MODELS = {
    "vgg16_cifar": {"name": "vgg16_cifar", "width": 0.125, "hidden": 64},
    "mobilenet_v2": {"name": "mobilenet_v2", "width_mult": 0.25},
    "cnn": {"name": "cnn", "channels": [16, 32], "features": 128},
}


def rounds_of(spec) -> dict:
    """One in-process run: its per-round wall times and final per-client accuracies."""
    stamps = [time.perf_counter()]
    result = run_experiment(spec, backend="local", reraise=True,
                            on_round=lambda *_: stamps.append(time.perf_counter()))
    last = spec.federation.rounds
    round_s = list(np.diff(stamps))
    return {"status": result.status, "round_s": round_s,
            "round_s_median": W.median_after_first(round_s),
            "accuracy": [r["accuracy"] for r in result.tables["clients"] if r["round"] == last]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    participants = round(W.HEAVY["federation"]["num_clients"]
                         * W.HEAVY["federation"]["participation"])
    report = {"load_before": os.getloadavg(), "cores": os.cpu_count(),
              "threads": torch.get_num_threads(), "torch": torch.__version__, "models": {}}
    for name in args.models.split(","):
        runs = {}
        for variant, cohort in (("sequential", "off"), ("cohort", participants)):
            spec = W.make_spec(W.HEAVY, cohort=cohort, model=MODELS[name],
                               dataset__n_samples=args.samples, federation__rounds=args.rounds,
                               eval_every=args.rounds)
            runs[variant] = rounds_of(spec)
        gap = max((abs(a - b) for a, b in zip(runs["cohort"]["accuracy"],
                                              runs["sequential"]["accuracy"])
                   if a is not None and b is not None), default=None)
        report["models"][name] = {
            **runs, "model": MODELS[name], "max_accuracy_gap": gap,
            "cohort_over_sequential": runs["cohort"]["round_s_median"]
            / runs["sequential"]["round_s_median"]}
        row = report["models"][name]
        print(f"{name:>13}: sequential {runs['sequential']['round_s_median']:.3f} s/round, "
              f"cohorts of {participants} {runs['cohort']['round_s_median']:.3f} s/round "
              f"({row['cohort_over_sequential']:.2f}×), max accuracy gap {gap}", flush=True)
    report["load_after"] = os.getloadavg()
    print(f"load average before {report['load_before']}, after {report['load_after']}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
