"""The Ray backend: client-worker actors on fractional resources and a coordinator actor.

Every actor is created on its own bundle of a placement group, with child-task capture, and
declares its CPUs (and GPU share) explicitly. Outside Tune the group is created here and checked
against the cluster first; inside a Tune trial the trial's own group is used (bundle 0 is the
trial function, then the coordinator, then one bundle per worker).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import ray
import torch
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raylf.config import ResourceSpec
from raylf.errors import SpecError
from raylf.runtime.blueprint import Blueprint
from raylf.runtime.coordinator import Coordinator, RoundOutcome
from raylf.runtime.shard import ClientShard
from raylf.training import tensor_bytes
from raylf.tree import map_leaves

PLACEMENT_TIMEOUT_S = 60.0
# A broadcast below this size travels inline in each task (Ray inlines small arguments); a
# ray.put costs about a millisecond of its own, more than copying a small model per task.
INLINE_BROADCAST_BYTES = 64 * 1024


def bundles(resources: ResourceSpec, workers: int) -> list[dict[str, float]]:
    """Coordinator bundle, then one bundle per client worker."""
    worker = {"CPU": resources.cpus_per_worker}
    if resources.gpus_per_worker:
        worker["GPU"] = resources.gpus_per_worker
    return [{"CPU": resources.coordinator_cpus}] + [dict(worker) for _ in range(workers)]


def check_fits(resources: ResourceSpec, workers: int) -> None:
    """Fail with the offending field when the cluster can never host these bundles."""
    total = ray.cluster_resources()
    need_cpu = resources.coordinator_cpus + workers * resources.cpus_per_worker
    need_gpu = workers * resources.gpus_per_worker
    problems = []
    if need_gpu and total.get("GPU", 0) == 0:
        problems.append((
            "resources.gpus_per_worker",
            f"{resources.gpus_per_worker} GPU × {workers} workers needs GPUs, but the Ray cluster "
            "has no GPU resource; set resources.gpus_per_worker=0 to train on CPUs, or declare "
            "GPUs (python -m raylf.run --num-gpus N, or ray start --num-gpus N)"))
    elif need_gpu > total.get("GPU", 0) + 1e-9:
        problems.append(("resources.gpus_per_worker",
                         f"needs {need_gpu:g} GPUs in all, the cluster has {total['GPU']:g}"))
    if need_cpu > total.get("CPU", 0) + 1e-9:
        problems.append((
            "resources.cpus_per_worker",
            f"coordinator {resources.coordinator_cpus:g} + {workers} workers × "
            f"{resources.cpus_per_worker:g} = {need_cpu:g} CPUs, the cluster has "
            f"{total.get('CPU', 0):g}"))
    if problems:
        raise SpecError(problems)


def as_arrays(message: Any) -> Any:
    """Tensors as NumPy arrays for the wire, anywhere in a nested message: Ray serializes those
    natively (a pickled torch tensor costs about a millisecond more per message, measured here
    for a 19 KB model)."""
    return map_leaves(message, lambda t: t.numpy(), torch.Tensor)


def as_tensors(message: Any) -> Any:
    """Back to tensors; arrays Ray hands out read-only (zero-copy) are copied once."""
    return map_leaves(message, lambda a: torch.from_numpy(a if a.flags.writeable else a.copy()),
                      np.ndarray)


_TENSOR_PARTS = ("uploads", "sums")  # the parts of a worker's result that carry tensors


def convert_uploads(result: dict, convert) -> dict:
    """A worker's result with its tensor parts (stacked uploads, sums) converted."""
    return result | {part: convert(result[part]) for part in _TENSOR_PARTS}


class RayShard(ClientShard):
    """A ClientShard whose tensor messages travel as NumPy arrays."""

    def setup(self, client_ids):
        return convert_uploads(super().setup(client_ids), as_arrays)

    def train(self, rnd, payload, client_ids, extras):
        return convert_uploads(super().train(rnd, as_tensors(payload), client_ids, extras),
                               as_arrays)

    def collect(self, rnd, payload, client_ids, extras):
        return convert_uploads(super().collect(rnd, as_tensors(payload), client_ids, extras),
                               as_arrays)

    def evaluate(self, rnd, payload, client_ids, extras):
        return super().evaluate(rnd, as_tensors(payload), client_ids, extras)


class RayPool:
    """Dispatches one task per worker per round; the broadcast is put in the object store once."""

    def __init__(self, actors: list, timeout_s: float):
        self.actors = actors
        self.timeout_s = timeout_s

    def _get(self, refs):
        return ray.get(refs, timeout=self.timeout_s)

    @staticmethod
    def _broadcast(payload, tasks: int):
        """As arrays, put in the object store once when several tasks share a large one."""
        arrays = as_arrays(payload)
        if tasks > 1 and tensor_bytes(payload) >= INLINE_BROADCAST_BYTES:
            return ray.put(arrays)
        return arrays

    def setup(self, work):
        results = self._get([self.actors[s].setup.remote(ids) for s, ids in sorted(work.items())])
        return [convert_uploads(r, as_tensors) for r in results]

    def train(self, rnd, payload, work, extras):
        ref = self._broadcast(payload, len(work))
        results = self._get([self.actors[s].train.remote(rnd, ref, ids, extras.get(s, {}))
                             for s, ids in sorted(work.items())])
        return [convert_uploads(r, as_tensors) for r in results]

    def collect(self, rnd, payload, work, extras):
        ref = self._broadcast(payload, len(work))
        results = self._get([self.actors[s].collect.remote(rnd, ref, ids, extras.get(s, {}))
                             for s, ids in sorted(work.items())])
        return [convert_uploads(r, as_tensors) for r in results]

    def evaluate(self, rnd, payload, work, extras):
        ref = self._broadcast(payload, len(work))
        parts = self._get([self.actors[s].evaluate.remote(rnd, ref, ids, extras.get(s, {}))
                           for s, ids in sorted(work.items())])
        return [row for part in parts for row in part]

    def save_personal(self, folder):
        self._get([a.save_personal.remote(folder) for a in self.actors])

    def load_personal(self, folder):
        self._get([a.load_personal.remote(folder) for a in self.actors])


class RayRuntime:
    name = "ray"

    def __init__(self, blueprint: Blueprint, placement: tuple[PlacementGroup, int] | None = None,
                 label: str = "raylf"):
        """``label`` names the actors in the dashboard: ``<label>/coordinator``, ``/worker-3``."""
        res = blueprint.spec.resources
        shards = blueprint.shards()
        self.timeout_s = res.round_timeout_s
        self._owned_group = placement is None
        if placement is None:
            check_fits(res, len(shards))
            group = placement_group(bundles(res, len(shards)), strategy="PACK")
            try:
                ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                remove_placement_group(group)
                raise SpecError([("resources", (
                    f"the Ray cluster could not place {bundles(res, len(shards))} within "
                    f"{PLACEMENT_TIMEOUT_S:.0f} s (other jobs may hold the resources)"))]) from None
            placement = (group, 0)
        self.group, first = placement

        def on_bundle(index: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(
                self.group, placement_group_bundle_index=first + index,
                placement_group_capture_child_tasks=True)

        shard_actor = ray.remote(RayShard)
        self.workers = [
            shard_actor.options(
                num_cpus=res.cpus_per_worker, num_gpus=res.gpus_per_worker,
                scheduling_strategy=on_bundle(1 + w), name=f"{label}/worker-{w}",
            ).remote(blueprint, ids, res.threads_per_worker(), w)
            for w, ids in enumerate(blueprint.hosted())
        ]
        self._queued: dict[int, ray.ObjectRef] = {}
        coordinator_actor = ray.remote(Coordinator)
        self.coordinator = coordinator_actor.options(
            num_cpus=res.coordinator_cpus, scheduling_strategy=on_bundle(0),
            name=f"{label}/coordinator",
        ).remote(blueprint, RayPool(self.workers, self.timeout_s))

    def run_round(self, rnd: int, then: int | None = None) -> RoundOutcome:
        """Round ``rnd``'s outcome; with ``then``, round ``then`` is queued on the coordinator
        first, so it starts the moment ``rnd`` ends instead of after the outcome's trip to the
        driver and the driver's own work on it (tables, Tune reports)."""
        ref = self._queued.pop(rnd, None) or self.coordinator.run_round.remote(rnd)
        if then is not None:
            self._queued[then] = self.coordinator.run_round.remote(then)
        return ray.get(ref, timeout=self.timeout_s)

    def setup(self) -> RoundOutcome | None:
        return ray.get(self.coordinator.setup.remote(), timeout=self.timeout_s)

    def checkpoint(self, folder: str):
        return ray.get(self.coordinator.checkpoint.remote(folder), timeout=self.timeout_s)

    def restore(self, snapshot) -> None:
        ray.get(self.coordinator.restore.remote(snapshot), timeout=self.timeout_s)

    def close(self) -> None:
        for actor in [self.coordinator, *self.workers]:
            ray.kill(actor, no_restart=True)
        if self._owned_group:
            remove_placement_group(self.group)
