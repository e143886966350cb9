"""Connecting to Ray the way the CLIs do: an existing cluster, or a local one started here."""

from __future__ import annotations

import os
import sys

import torch


def connect(address: str | None, num_gpus: float | None, wanted_gpus: float,
            num_cpus: int | None = None) -> None:
    """Join ``address`` (or $RAY_ADDRESS), else start a single-node Ray on this machine.

    A local start declares ``num_gpus`` logical GPUs; by default the physical count, or one
    logical GPU when the spec asks for GPU shares on a machine that has none (training then
    runs on the CPU, as on any CPU-only node of a cluster that declares GPUs). ``--num-gpus 0``
    refuses that and makes such a spec fail with a clear message instead.
    """
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
        return
    physical = torch.cuda.device_count()
    if num_gpus is None:
        num_gpus = physical
        if wanted_gpus and not physical:
            num_gpus = 1
            print("raylf: no GPU on this machine; declaring 1 logical GPU so the spec's GPU "
                  "shares schedule (training runs on the CPU; --num-gpus 0 forbids this)",
                  file=sys.stderr)
    ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
             logging_level="warning", configure_logging=True)
