"""The in-process backend: the same shards and coordinator, called directly and sequentially."""

from __future__ import annotations

from raylf.runtime.blueprint import Blueprint
from raylf.runtime.coordinator import Coordinator, RoundOutcome
from raylf.runtime.shard import ClientShard


class LocalPool:
    def __init__(self, shards: list[ClientShard]):
        self.shards = shards

    def train(self, rnd, payload, work, extras):
        return [self.shards[s].train(rnd, payload, ids, extras.get(s, {}))
                for s, ids in sorted(work.items())]

    def evaluate(self, rnd, payload, work, extras):
        return [row for s, ids in sorted(work.items())
                for row in self.shards[s].evaluate(rnd, payload, ids, extras.get(s, {}))]

    def personal_states(self):
        return [shard.personal_states() for shard in self.shards]

    def load_personal_states(self, states):
        for shard, state in zip(self.shards, states):
            shard.load_personal_states(state)


class LocalRuntime:
    """Runs every worker's shard in this process; the reference for the Ray backend."""

    name = "local"

    def __init__(self, blueprint: Blueprint):
        shards = [ClientShard(blueprint, ids) for ids in blueprint.hosted()]
        self.coordinator = Coordinator(blueprint, LocalPool(shards))

    def run_round(self, rnd: int, then: int | None = None) -> RoundOutcome:
        """Round ``rnd``; ``then`` (the next round, for overlapping backends) is ignored."""
        return self.coordinator.run_round(rnd)

    def checkpoint(self):
        return self.coordinator.checkpoint()

    def restore(self, snapshot) -> None:
        self.coordinator.restore(snapshot)

    def close(self) -> None:
        pass
