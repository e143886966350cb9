"""Connecting to Ray the way the CLIs do: an existing cluster, or a local one started here."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

import torch

from raylf import plugins

DASHBOARD_HOST = "127.0.0.1"  # the dashboard and Jobs API execute code: loopback only


def _job_runtime_env() -> dict:
    """The runtime environment this driver's Ray Job was submitted with ({} outside a job)."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    return (json.loads(raw).get("runtime_env") or {}) if raw else {}


def local_totals(num_cpus: int | None, num_gpus: float | None,
                 wanted_gpus: float) -> dict[str, float]:
    """What a Ray started here by :func:`connect` will hold, known before it starts: a plan
    that can never fit (GPU shares with ``--num-gpus 0``) is refused before paying for a start,
    and ``--dry-run`` plans against it without starting one."""
    gpus = num_gpus
    if gpus is None:
        gpus = torch.cuda.device_count() or (1.0 if wanted_gpus else 0.0)
    return {"CPU": float(num_cpus or os.cpu_count() or 1), "GPU": float(gpus)}


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
    if num_gpus is None and wanted_gpus and not torch.cuda.device_count():
        print("raylf: no GPU on this machine; declaring 1 logical GPU so the spec's GPU "
              "shares schedule (training runs on the CPU; --num-gpus 0 forbids this)",
              file=sys.stderr)
    num_gpus = local_totals(num_cpus, num_gpus, wanted_gpus)["GPU"]
    return ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus,
                    include_dashboard=dashboard, dashboard_host=DASHBOARD_HOST,
                    logging_level="info" if verbose else "warning", configure_logging=True,
                    **common)


@dataclass(frozen=True)
class Capacity:
    """What a sweep is planned against: the connected cluster's resources now and the most it
    can grow to; ``most`` is None where an autoscaler adds nodes without saying how many."""

    now: dict[str, float]
    most: dict[str, float] | None

    @property
    def autoscaling(self) -> bool:
        return self.most != self.now


def capacity() -> Capacity:
    """The connected cluster's capacity. Autoscaler v2 and KubeRay publish the most their node
    groups reach; the v1 autoscaler of ``ray up`` clusters does not, and is recognised by node
    types of its own (a cluster that cannot launch nodes reports one anonymous type per node)."""
    import ray

    now = {kind: float(amount) for kind, amount in ray.cluster_resources().items()}
    published = ray._private.state.state.get_max_resources_from_cluster_config()
    if published:
        kinds = {*now, *published}
        return Capacity(now, {k: max(now.get(k, 0.0), float(published.get(k, 0))) for k in kinds})
    return Capacity(now, None if _launches_nodes() else now)


def _launches_nodes() -> bool:
    """Whether the cluster's v1 autoscaler has node types to launch (from its status report)."""
    from ray._private.ray_constants import DEBUG_AUTOSCALING_STATUS
    from ray.autoscaler._private.util import format_readonly_node_type
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(DEBUG_AUTOSCALING_STATUS)
    report = (json.loads(raw).get("autoscaler_report") if raw else None) or {}
    types = report.get("node_type_mapping") or {}
    return any(kind != format_readonly_node_type(node) for node, kind in types.items())
