"""The in-process backend: the same shards and coordinator, called directly and sequentially."""

from __future__ import annotations

import numpy as np

from raylf.runtime.blueprint import Blueprint
from raylf.runtime.coordinator import Coordinator, RoundOutcome
from raylf.runtime.memory import keep_freed_memory
from raylf.runtime.shard import ClientShard


class LocalPool:
    def __init__(self, shards: list[ClientShard]):
        self.shards = shards

    def setup(self, work):
        return [self.shards[s].setup(ids) for s, ids in sorted(work.items())]

    def train(self, rnd, payload, work, extras):
        return [self.shards[s].train(rnd, payload, ids, extras.get(s, {}))
                for s, ids in sorted(work.items())]

    def answer(self, number, rnd, payload, work, extras):
        return [self.shards[s].answer(number, rnd, payload, ids, extras.get(s, {}))
                for s, ids in sorted(work.items())]

    def evaluate(self, rnd, payload, work, extras):
        return [row for s, ids in sorted(work.items())
                for row in self.shards[s].evaluate(rnd, payload, ids, extras.get(s, {}))]

    def save_personal(self, folder):
        for shard in self.shards:
            shard.save_personal(folder)

    def load_personal(self, folder):
        for shard in self.shards:
            shard.load_personal(folder)


def hosting_pool(blueprint: Blueprint, client_ids: np.ndarray, threads: int) -> LocalPool:
    """The only shard of a one-worker experiment, for a coordinator in the process that trains
    it (a Ray host actor, or an inline trial's process): a process raylf trains in, so its
    allocator keeps what training frees, once the shard's data are resident."""
    shard = ClientShard(blueprint, client_ids, threads, index=0)
    keep_freed_memory()
    return LocalPool([shard])


class LocalRuntime:
    """Runs every worker's shard in this process; the reference for the Ray backend."""

    name = "local"

    def __init__(self, blueprint: Blueprint):
        shards = [ClientShard(blueprint, ids, index=w)
                  for w, ids in enumerate(blueprint.hosted())]
        self.coordinator = Coordinator(blueprint, LocalPool(shards))

    def run_round(self, rnd: int, then: int | None = None) -> RoundOutcome:
        """Round ``rnd``; ``then`` (the next round, for overlapping backends) is ignored."""
        return self.coordinator.run_round(rnd)

    def setup(self) -> RoundOutcome | None:
        return self.coordinator.setup()

    def checkpoint(self, folder: str):
        return self.coordinator.checkpoint(folder)

    def restore(self, snapshot) -> None:
        self.coordinator.restore(snapshot)

    def close(self, finished: bool = False) -> None:
        pass
