"""The inline backend: a one-worker experiment trained in the calling process, which a Ray
backend sets aside for it (a sweep trial's own, on a bundle holding the worker's resources:
``raylf.sweep.placement``), every call bounded by ``resources.round_timeout_s`` as on Ray.

Why: on the Ray backend a one-worker trial starts a host actor beside its trial function
(``RayHost``): a second process per trial slot importing torch, a second load of the data, and
Ray's task machinery on both ends of every round, all to relay rounds to a process that could
train them itself. The cheap-trials sweep (benchmarks/cheap_trials.py: 48 trials of 100 rounds
on 2 cores) spent 2.31x its in-process compute bound in its trial phase that way, 1.64x inline
(this change alone, the same hour).

Every call runs on the process's helper thread (``process_caller``), which the caller waits
for at most ``round_timeout_s``. A call that overruns cannot be stopped inside the process: it
is left running and the run fails naming the setting (its tables written as on Ray). A later
run of the process (the next trial of a sweep's group) gets a new thread; Tune ends the process
once the failed trial's attempt ends instead of keeping it for the next one.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from raylf.errors import overran
from raylf.runtime.blueprint import Blueprint
from raylf.runtime.coordinator import Coordinator, RoundOutcome
from raylf.runtime.local import hosting_pool
from raylf.runtime.memory import reset_peak_memory


class Caller:
    """One daemon thread that runs the calls handed to it, one at a time, each waited for at
    most ``timeout_s`` (then ``overran``; the call goes on, unstoppable, and the caller is
    ``stuck`` after it). One thread for all of a process's runs (``process_caller``): a thread
    per call cost a round of the cheap-trials workload 5 %, and a thread per run a 3-round
    digits trial 6 % (29.4 against 27.7 ms, medians of six alternating runs of 30 trials on
    2 cores; torch sets up each new thread's state on its first op)."""

    def __init__(self, name: str):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self.stuck = False
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            call, args, done, outcome = item
            try:
                outcome["value"] = call(*args)
            except BaseException as exc:  # handed to the waiting caller
                outcome["error"] = exc
            done.set()

    def __call__(self, call: Callable[..., Any], *args, timeout_s: float, what: str) -> Any:
        """``call(*args)``'s value, or its exception raised here with its own traceback."""
        done, outcome = threading.Event(), {}
        self._calls.put((call, args, done, outcome))
        if not done.wait(timeout_s):
            self.stuck = True
            raise overran(what, timeout_s)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def close(self) -> None:
        self._calls.put(None)


_callers: list[Caller] = []  # this process's, while none of its calls overran


def process_caller() -> Caller:
    """The process's caller, or a new one if its last call overran (that thread is stuck, and
    Tune ends a process whose trial failed, but nothing here relies on it)."""
    if not _callers or _callers[-1].stuck:
        _callers[:] = [Caller("raylf inline rounds")]
    return _callers[-1]


class InlineRuntime:
    """The coordinator and the only shard of a one-worker experiment, in this process."""

    name = "inline"

    def __init__(self, blueprint: Blueprint):
        res = blueprint.spec.resources
        (clients,) = blueprint.hosted()
        self.timeout_s = res.round_timeout_s
        reset_peak_memory()  # the process may have run an earlier trial: peaks are this one's
        self.coordinator = Coordinator(blueprint, hosting_pool(blueprint, clients,
                                                               res.threads_per_worker()))
        self._caller = process_caller()

    def _bounded(self, what: str, call: Callable[..., Any], *args) -> Any:
        return self._caller(call, *args, timeout_s=self.timeout_s, what=what)

    def run_round(self, rnd: int, then: int | None = None) -> RoundOutcome:
        """Round ``rnd``; ``then`` (the next round, for overlapping backends) is ignored."""
        return self._bounded(f"round {rnd}", self.coordinator.run_round, rnd)

    def setup(self) -> RoundOutcome | None:
        return self._bounded("the setup round", self.coordinator.setup)

    def checkpoint(self, folder: str):
        return self._bounded("a checkpoint", self.coordinator.checkpoint, folder)

    def restore(self, snapshot) -> None:
        self._bounded("restoring the checkpoint", self.coordinator.restore, snapshot)

    def close(self, finished: bool = False) -> None:
        """The caller's thread stays for the process's next run."""
