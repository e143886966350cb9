"""Shared fixtures: one Ray start per test session (per xdist worker), small specs built in code;
the order tests start in, and the no-Ray-state-left check after the last one."""

from __future__ import annotations

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import pytest  # noqa: E402

# the contract checks' plain asserts explain themselves in this suite as a test's own do
pytest.register_assert_rewrite("raylf.testing")

from raylf.config import validate  # noqa: E402
from raylf.schema import set_path  # noqa: E402


def pytest_collection_modifyitems(items):
    """End-to-end tests (``slow``) first, the rest after in their order: the two xdist workers
    (pyproject's ``-n 2 --maxschedchunk 1``: one test at a time to whichever is free) share the
    long ones while both are free, and the many short tests fill the gaps, instead of one long
    test starting last and running alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_sessionfinish(session):
    """After every test, in the process that ran the session (not in an xdist worker): fail the
    run when it left Ray state behind (tests/hygiene.py)."""
    if hasattr(session.config, "workerinput"):
        return
    from tests.hygiene import problems

    found = problems()
    if found:
        session.config.get_terminal_writer().line(
            "\nRay state left behind by the suite:\n" + "\n".join(found), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
    for key, value in changes.items():  # federation__rounds=3: "__" for the dots of a path
        set_path(spec, key.replace("__", "."), value)
    return spec


@pytest.fixture
def small_spec():
    def make(**changes):
        return validate(small_spec_dict(**changes))

    return make
