"""Connecting to Ray the way the CLIs do: an existing cluster, or a local one started here."""

from __future__ import annotations

import json
import os
import sys

import torch

from raylf import plugins

DASHBOARD_HOST = "127.0.0.1"  # the dashboard and Jobs API execute code: loopback only


def _job_runtime_env() -> dict:
    """The runtime environment this driver's Ray Job was submitted with ({} outside a job)."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    return (json.loads(raw).get("runtime_env") or {}) if raw else {}


def connect(address: str | None, num_gpus: float | None, wanted_gpus: float,
            num_cpus: int | None = None, dashboard: bool = False, verbose: bool = False):
    """Join ``address`` (or $RAY_ADDRESS), else start a single-node Ray on this machine; return
    Ray's context (None when this process was already connected).

    A local start declares ``num_gpus`` logical GPUs; by default the physical count, or one
    logical GPU when the spec asks for GPU shares on a machine that has none (training then
    runs on the CPU, as on any CPU-only node of a cluster that declares GPUs). ``--num-gpus 0``
    refuses that and makes such a spec fail with a clear message instead. ``dashboard`` starts
    the local dashboard on 127.0.0.1. Workers log warnings and errors only unless ``verbose``;
    prefixes of forwarded worker output are coloured only on a terminal. The plugins named in
    ``RAYLF_PLUGINS`` travel to every worker (:func:`raylf.plugins.runtime_env`).
    """
    import ray

    if ray.is_initialized():
        return None
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    if not sys.stdout.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    common = {"runtime_env": plugins.runtime_env(_job_runtime_env()),
              "logging_config": ray.LoggingConfig(log_level="INFO" if verbose else "WARNING")}
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        return ray.init(address=address, log_to_driver=True, **common)
    physical = torch.cuda.device_count()
    if num_gpus is None:
        num_gpus = physical
        if wanted_gpus and not physical:
            num_gpus = 1
            print("raylf: no GPU on this machine; declaring 1 logical GPU so the spec's GPU "
                  "shares schedule (training runs on the CPU; --num-gpus 0 forbids this)",
                  file=sys.stderr)
    return ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus,
                    include_dashboard=dashboard, dashboard_host=DASHBOARD_HOST,
                    logging_level="info" if verbose else "warning", configure_logging=True,
                    **common)
