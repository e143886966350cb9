"""The Ray backend against the in-process reference, placement and resource errors."""

from __future__ import annotations

import pytest

from raylf.config import SpecError
from raylf.experiment import run_experiment
from raylf.runtime.ray_backend import bundles, check_fits, warm_actors
from raylf.testing import run_local_as_a_ray_worker, without_timing


@pytest.mark.parametrize("method, workers", [
    ("fedavg_se", 2), ("fedavg", 2),  # sharded / replicated client data
    ("fedavg_se", 1)])  # one worker: the coordinator hosts the shard (RayHost)
def test_ray_and_local_agree_exactly(ray_cluster, small_spec, method, workers):
    """Same partition, same participation stream, same per-client accuracies (CPU, 1 thread)."""
    spec = small_spec(federation__rounds=6, method__name=method,
                      resources={"workers": workers, "cpus_per_worker": 0.5,
                                 "gpus_per_worker": 0.25})
    local = run_local_as_a_ray_worker(spec)
    remote = run_experiment(spec, backend="ray").tables
    assert remote["trials"][0]["status"] == "ok", remote["trials"][0]["error"]

    def partition(t):
        return [(r["client_id"], r["group"], r["n_train"], r["n_test"]) for r in t["clients"]]

    assert partition(remote) == partition(local)
    assert [r["participant_ids"] for r in remote["rounds"]] == \
           [r["participant_ids"] for r in local["rounds"]]
    assert [r["accuracy"] for r in remote["clients"]] == [r["accuracy"] for r in local["clients"]]
    assert [r["loss"] for r in remote["rounds"]] == pytest.approx(
        [r["loss"] for r in local["rounds"]], rel=1e-5)


def test_actors_fill_every_bundle_of_the_group_with_gpu_shares(ray_cluster, small_spec):
    """While rounds run, the group's CPU and GPU reservations are entirely held by its actors."""
    import ray

    seen = {}

    def look(outcome, runtime, progress, snapshot):
        if not seen:
            pg = runtime.group.id.hex()
            total, free = ray.cluster_resources(), ray.available_resources()
            seen.update({kind: (total.get(f"{kind}_group_{pg}"), free.get(f"{kind}_group_{pg}", 0))
                         for kind in ("CPU", "GPU")})

    spec = small_spec(resources={"workers": 3, "cpus_per_worker": 0.5, "gpus_per_worker": 0.25})
    result = run_experiment(spec, backend="ray", on_round=look)
    assert result.status == "ok", result.error
    assert seen["CPU"] == (pytest.approx(0.25 + 3 * 0.5), 0)
    assert seen["GPU"] == (pytest.approx(3 * 0.25), 0)


@pytest.mark.parametrize("workers", [2, 1])
def test_a_finished_run_hands_its_actors_to_the_next_run_of_the_same_shape(ray_cluster,
                                                                           small_spec, workers):
    """The next run reopens the parked actors (the same processes) and its tables equal the
    in-process reference's, as a run on fresh actors does (above); leaving ``warm_actors``
    removes the parked group."""
    import ray

    res = {"workers": workers, "cpus_per_worker": 0.5, "gpus_per_worker": 0.25}
    first = small_spec(method__name="fedavg_se", federation__rounds=2, resources=res)
    second = small_spec(method__name="fedavg", federation__rounds=3, seed=5, resources=res)
    used = []

    def actors(outcome, runtime, progress, snapshot):
        used.append((runtime.group, [a._actor_id for a in [runtime.coordinator, *runtime.workers]]))

    local = run_local_as_a_ray_worker(second)
    with warm_actors():
        assert run_experiment(first, backend="ray", on_round=actors).status == "ok"
        warm = run_experiment(second, backend="ray", on_round=actors).tables
    assert used[0] == used[-1]  # one group and its actors served both runs
    assert len(used[0][1]) == (1 if workers == 1 else 1 + workers)
    assert ray.util.placement_group_table(used[0][0])["state"] == "REMOVED"
    for table in ("rounds", "clients"):
        assert without_timing(warm[table]) == without_timing(local[table])


def test_bundles_reserve_one_per_actor(small_spec):
    res = small_spec().resources
    assert bundles(res, 2) == [{"CPU": 0.25}, {"CPU": 0.5, "GPU": 0.25}, {"CPU": 0.5, "GPU": 0.25}]


def test_no_gpu_resource_fails_clearly(monkeypatch, small_spec):
    monkeypatch.setattr("ray.cluster_resources", lambda: {"CPU": 8.0})
    with pytest.raises(SpecError) as info:
        check_fits(small_spec().resources, 4)
    (field, message), = info.value.problems
    assert field == "resources.gpus_per_worker" and "no GPU resource" in message


def test_too_many_cpus_fails_clearly(monkeypatch, small_spec):
    monkeypatch.setattr("ray.cluster_resources", lambda: {"CPU": 2.0, "GPU": 1.0})
    res = small_spec(resources={"workers": 4, "cpus_per_worker": 1}).resources
    with pytest.raises(SpecError, match="resources.cpus_per_worker"):
        check_fits(res, 4)


def test_a_run_past_its_round_timeout_fails_naming_the_setting(ray_cluster, small_spec):
    """Ray's GetTimeoutError names no setting; the recorded error names the one to raise."""
    spec = small_spec(resources={"workers": 1, "cpus_per_worker": 0.5, "round_timeout_s": 0.01})
    result = run_experiment(spec, backend="ray")
    assert result.status == "failed"
    assert "took longer than resources.round_timeout_s=0.01 s" in result.error, result.error


def test_inline_runs_of_a_process_share_one_caller_thread_until_a_call_overruns():
    """The inline backend's helper thread serves every run of the process (a thread per run
    cost a tiny trial 6 %); a call past its timeout leaves that thread stuck, and the next run
    gets a new one."""
    import threading

    from raylf.runtime.inline import process_caller

    first = process_caller()
    assert process_caller() is first and first(lambda x: x + 1, 1, timeout_s=5, what="a") == 2
    release = threading.Event()
    with pytest.raises(TimeoutError, match="took longer than resources.round_timeout_s"):
        first(release.wait, timeout_s=0.01, what="a stuck call")
    assert first.stuck
    second = process_caller()
    assert second is not first and second(lambda: "served", timeout_s=5, what="b") == "served"
    release.set()  # the stuck call ends: its thread takes no more calls
