"""The Ray backend: client-worker actors on fractional resources and a coordinator actor.

Every actor is created on its own bundle of a placement group, with child-task capture, and
declares its CPUs (and GPU share) explicitly. Outside Tune the group is created here and checked
against the cluster first; inside a Tune trial the trial's own group is used (bundle 0 is the
trial function, then the coordinator, then one bundle per worker). With one worker the
coordinator hosts that worker's shard itself, on the worker's bundle (``RayHost``).

A finished run parks its actors instead of killing them when the next run of the process can
take them over (``park``): starting an actor process costs an import of torch, and three of
them are most of a short trial's time on a small machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raylf.errors import SpecError, overran
from raylf.runtime.blueprint import Blueprint
from raylf.runtime.coordinator import Coordinator, RoundOutcome
from raylf.runtime.local import hosting_pool
from raylf.runtime.memory import keep_freed_memory, reset_peak_memory
from raylf.runtime.shard import ClientShard
from raylf.schema import ResourceSpec
from raylf.tree import map_leaves, tensor_bytes

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


def check_fits(resources: ResourceSpec, workers: int,
               total: dict[str, float] | None = None) -> None:
    """Fail with the offending field when the cluster (``total``: by default the connected
    one's resources) can never host these bundles."""
    total = ray.cluster_resources() if total is None else total
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


def wait(ref, timeout_s: float, what: str):
    """``ray.get`` bounded by ``resources.round_timeout_s``, an excess reported as that
    setting's (Ray's own message names no setting)."""
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise overran(what, timeout_s) from None


class Reopenable:
    """An actor that can become a fresh instance in its own, already started process."""

    def reopen(self, *args) -> None:
        """Discard this instance's state and construct again from ``args``: nothing of the
        previous experiment survives but the process (its imports, torch's thread pool)."""
        self.__dict__.clear()
        self.__init__(*args)


class RayCoordinator(Reopenable, Coordinator):
    """The coordinator as an actor a later run can take over."""


class RayShard(Reopenable, ClientShard):
    """A ClientShard whose tensor messages travel as NumPy arrays, in a process whose allocator
    keeps the memory each training step frees (``keep_freed_memory``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        keep_freed_memory()  # once the data is resident (see there)

    def reopen(self, *args) -> None:
        reset_peak_memory()  # the peak recorded per round is this experiment's, not the process's
        super().reopen(*args)

    def setup(self, client_ids):
        return convert_uploads(super().setup(client_ids), as_arrays)

    def train(self, rnd, payload, client_ids, extras):
        return convert_uploads(super().train(rnd, as_tensors(payload), client_ids, extras),
                               as_arrays)

    def answer(self, number, rnd, payload, client_ids, extras):
        return convert_uploads(super().answer(number, rnd, as_tensors(payload), client_ids,
                                              extras), as_arrays)

    def evaluate(self, rnd, payload, client_ids, extras):
        return super().evaluate(rnd, as_tensors(payload), client_ids, extras)


class RayHost(Reopenable, Coordinator):
    """The coordinator and a trial's only client shard in one actor, on the worker's bundle.

    Why: with one worker, a round on a coordinator actor is a relay, driver → coordinator →
    worker and back, and that second hop (a task, the model out and the updates back through
    Ray's serialization) cost more than a tiny round's training (issue 32, W1: 0.0087 s a round
    on Ray against 0.0040 in process). Here the shard is called in process, as by the local
    backend, and a round is one call from the driver, which queues the next before it handles
    this one. The coordinator's bundle stays reserved and idle: a Tune trial's group was sized
    before the trial chose."""

    def __init__(self, blueprint: Blueprint, client_ids, threads: int):
        super().__init__(blueprint, hosting_pool(blueprint, client_ids, threads))

    def reopen(self, *args) -> None:
        reset_peak_memory()
        super().reopen(*args)


class RayPool:
    """Dispatches one task per worker per round; the broadcast is put in the object store once."""

    def __init__(self, actors: list, timeout_s: float):
        self.actors = actors
        self.timeout_s = timeout_s

    def _get(self, call: str, refs):
        return wait(refs, self.timeout_s, f"the workers' {call}")

    @staticmethod
    def _broadcast(payload, tasks: int):
        """As arrays, put in the object store once when several tasks share a large one."""
        arrays = as_arrays(payload)
        if tasks > 1 and tensor_bytes(payload) >= INLINE_BROADCAST_BYTES:
            return ray.put(arrays)
        return arrays

    def _round_call(self, call: str, head: tuple, payload, work, extras) -> list:
        """``call(*head, payload, client_ids, extras)`` on every worker with work."""
        ref = self._broadcast(payload, len(work))
        return self._get(call, [getattr(self.actors[s], call).remote(*head, ref, ids,
                                                                    extras.get(s, {}))
                                for s, ids in sorted(work.items())])

    def setup(self, work):
        results = self._get("setup", [self.actors[s].setup.remote(ids)
                                      for s, ids in sorted(work.items())])
        return [convert_uploads(r, as_tensors) for r in results]

    def train(self, rnd, payload, work, extras):
        return [convert_uploads(r, as_tensors)
                for r in self._round_call("train", (rnd,), payload, work, extras)]

    def answer(self, number, rnd, payload, work, extras):
        return [convert_uploads(r, as_tensors)
                for r in self._round_call("answer", (number, rnd), payload, work, extras)]

    def evaluate(self, rnd, payload, work, extras):
        parts = self._round_call("evaluate", (rnd,), payload, work, extras)
        return [row for part in parts for row in part]

    def save_personal(self, folder):
        self._get("save_personal", [a.save_personal.remote(folder) for a in self.actors])

    def load_personal(self, folder):
        self._get("load_personal", [a.load_personal.remote(folder) for a in self.actors])


@dataclass
class Parked:
    """A finished run's actors, waiting for the next run of the same shape in this process."""

    key: tuple
    coordinator: Any
    workers: list
    group: PlacementGroup | None  # a group the run created itself, parked with its actors

    def release(self) -> None:
        for actor in [self.coordinator, *self.workers]:
            ray.kill(actor, no_restart=True)
        if self.group is not None:
            remove_placement_group(self.group)


_parked: Parked | None = None
_park_owned_groups = False


def park(actors: Parked) -> None:
    global _parked
    release_parked()
    _parked = actors


def take_parked(key: tuple) -> Parked | None:
    """The parked actors if they fit ``key``; any others are released (their resources may be
    what the new run needs)."""
    global _parked
    if _parked is not None and _parked.key != key:
        release_parked()
    parked, _parked = _parked, None
    return parked


def release_parked() -> None:
    global _parked
    if _parked is not None:
        _parked.release()
        _parked = None


@contextmanager
def warm_actors() -> Iterator[None]:
    """Inside this block, runs that create their own placement group park it with their actors
    too (many experiments of one shape from one driver: the contract suite); whatever is parked
    is released at the end. Elsewhere only runs on a placement group they were given (a Tune
    trial's, kept by Tune for the next trial of a reused trial process) park, since a parked
    group holds its resources until released."""
    global _park_owned_groups
    _park_owned_groups = True
    try:
        yield
    finally:
        _park_owned_groups = False
        release_parked()


class RayRuntime:
    name = "ray"

    def __init__(self, blueprint: Blueprint, placement: tuple[PlacementGroup, int] | None = None,
                 label: str = "raylf"):
        """``label`` names the actors in the dashboard: ``<label>/coordinator``, ``/worker-3``
        (actors taken over from a parked run keep the name they were started with)."""
        res = blueprint.spec.resources
        hosted = blueprint.hosted()
        self.timeout_s = res.round_timeout_s
        self._owned_group = placement is None
        self._key = (None if placement is None else (placement[0].id.hex(), placement[1]),
                     str(bundles(res, len(hosted))), res.threads_per_worker())
        self._queued: dict[int, ray.ObjectRef] = {}
        parked = take_parked(self._key)
        if parked is not None and self._reopen(parked, blueprint, hosted, res):
            self.group = parked.group if self._owned_group else placement[0]
            self.workers, self.coordinator = parked.workers, parked.coordinator
            return
        if placement is None:
            placement = (self._own_group(res, len(hosted)), 0)
        self.group, first = placement

        def on_bundle(index: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(
                self.group, placement_group_bundle_index=first + index,
                placement_group_capture_child_tasks=True)

        on_worker = dict(num_cpus=res.cpus_per_worker, num_gpus=res.gpus_per_worker)
        if len(hosted) == 1:
            self.workers = []
            self.coordinator = ray.remote(RayHost).options(
                **on_worker, scheduling_strategy=on_bundle(1),
                name=f"{label}/coordinator+worker-0",
            ).remote(*self._coordinator_args(blueprint, hosted, res))
            return
        shard_actor = ray.remote(RayShard)
        self.workers = [
            shard_actor.options(
                **on_worker, scheduling_strategy=on_bundle(1 + w), name=f"{label}/worker-{w}",
            ).remote(blueprint, ids, res.threads_per_worker(), w)
            for w, ids in enumerate(hosted)
        ]
        coordinator_actor = ray.remote(RayCoordinator)
        self.coordinator = coordinator_actor.options(
            num_cpus=res.coordinator_cpus, scheduling_strategy=on_bundle(0),
            name=f"{label}/coordinator",
        ).remote(*self._coordinator_args(blueprint, hosted, res))

    def _coordinator_args(self, blueprint: Blueprint, hosted, res: ResourceSpec) -> tuple:
        """What the coordinator actor is built (or reopened) from: with one worker, the shard
        it hosts itself (``RayHost``); else the pool of worker actors."""
        if len(hosted) == 1:
            return blueprint, hosted[0], res.threads_per_worker()
        return blueprint, RayPool(self.workers, self.timeout_s)

    @staticmethod
    def _own_group(res: ResourceSpec, workers: int) -> PlacementGroup:
        check_fits(res, workers)
        group = placement_group(bundles(res, workers), strategy="PACK")
        try:
            ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(group)
            raise SpecError([("resources", (
                f"the Ray cluster could not place {bundles(res, workers)} within "
                f"{PLACEMENT_TIMEOUT_S:.0f} s (other jobs may hold the resources)"))]) from None
        return group

    def _reopen(self, parked: Parked, blueprint: Blueprint, hosted, res: ResourceSpec) -> bool:
        """Turn the parked actors into this run's; False (and released) if one has died."""
        try:
            ray.get([worker.reopen.remote(blueprint, ids, res.threads_per_worker(), w)
                     for w, (worker, ids) in enumerate(zip(parked.workers, hosted))],
                    timeout=self.timeout_s)
            self.workers = parked.workers
            ray.get(parked.coordinator.reopen.remote(*self._coordinator_args(
                blueprint, hosted, res)), timeout=self.timeout_s)
        except ray.exceptions.RayError:
            parked.release()
            return False
        return True

    def run_round(self, rnd: int, then: int | None = None) -> RoundOutcome:
        """Round ``rnd``'s outcome; with ``then``, round ``then`` is queued on the coordinator
        first, so it starts the moment ``rnd`` ends instead of after the outcome's trip to the
        driver and the driver's own work on it (tables, Tune reports)."""
        ref = self._queued.pop(rnd, None) or self.coordinator.run_round.remote(rnd)
        if then is not None:
            self._queued[then] = self.coordinator.run_round.remote(then)
        return wait(ref, self.timeout_s, f"round {rnd}")

    def setup(self) -> RoundOutcome | None:
        return wait(self.coordinator.setup.remote(), self.timeout_s,
                    "starting the workers and the setup round")

    def checkpoint(self, folder: str):
        return wait(self.coordinator.checkpoint.remote(folder), self.timeout_s, "a checkpoint")

    def restore(self, snapshot) -> None:
        wait(self.coordinator.restore.remote(snapshot), self.timeout_s,
             "starting the workers and restoring the checkpoint")

    def close(self, finished: bool = False) -> None:
        """Park the actors for the next run if this one ``finished`` (no failure, nothing
        queued) and may park (see ``warm_actors``); otherwise kill them."""
        actors = Parked(self._key, self.coordinator, self.workers,
                        self.group if self._owned_group else None)
        if finished and not self._queued and (_park_owned_groups or not self._owned_group):
            park(actors)
        else:
            actors.release()
