"""Shared fixtures: one Ray start per test session, small specs built in code."""

from __future__ import annotations

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import pytest  # noqa: E402

from raylf.config import validate  # noqa: E402


@pytest.fixture(scope="session")
def ray_cluster():
    """2 CPUs and a fake GPU, so fractional-GPU placement is exercised on CPU-only machines."""
    import ray

    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False,
             object_store_memory=150 * 2**20, logging_level="warning")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def s3():
    """An S3-compatible endpoint on loopback (tests/s3.py: moto's server, IAM checks on), and
    this process's environment pointed at it with write credentials, as a user's shell is."""
    from tests.s3 import S3Endpoint, restore_env, set_env

    endpoint = S3Endpoint()
    before = set_env(endpoint.env())
    yield endpoint
    restore_env(before)
    endpoint.close()


def small_spec_dict(**changes) -> dict:
    spec = {
        "name": "t",
        "seed": 3,
        "dataset": {"name": "digits"},
        "scenario": {"name": "label_subset", "k": 2},
        "model": {"name": "mlp", "hidden": [32]},
        "method": {"name": "fedavg_se"},
        "federation": {"num_clients": 8, "participation": 0.5, "rounds": 4, "batch_size": 16,
                       "optimizer": {"lr": 0.05, "momentum": 0.9}},
        "eval_every": 2,
        "resources": {"workers": 2, "cpus_per_worker": 0.5, "gpus_per_worker": 0.25},
    }
    for dotted, value in changes.items():
        node = spec
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return spec


TIMING = {"round_s", "wall_s", "trial_id", "worker_peak_mb"}  # measurements, not results


def without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def run_local_as_a_ray_worker(spec) -> dict:
    """The in-process reference run's tables with one torch thread, as a Ray worker of these
    specs has (its threads = its CPUs): the arithmetic the Ray backend must reproduce."""
    import torch

    from raylf.experiment import run_experiment

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_experiment(spec, backend="local").tables
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def small_spec():
    def make(**changes):
        return validate(small_spec_dict(**changes))

    return make
