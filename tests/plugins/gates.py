"""A test plugin: gates that hold a sweep at a chosen point until the test has acted.

``gated_fedavg_se`` is FedAvg-SE (private heads: personal state that a resume must restore)
whose first client to reach ``gate_round`` creates ``gate_file`` (holding its worker's name,
``<trial id>/…``, and, on the next line, its node's id) and then waits for
``<gate_file>.release``; ``kill_worker`` makes that worker ``ray.kill`` itself instead. With
``$RAYLF_TABLE_GATE`` set, the first trial to write its tables stops after its rounds and
clients tables and before the trials row of its end (written last) in the same way; with
``$RAYLF_DROP_GATE`` set, the first trial to drop its checkpoints (its tables complete) holds
right after, before Tune has seen it end. A gate file that already exists lets everyone
through, so a resumed attempt passes. Every wait has a deadline.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import Field

from raylf import checkpoints, results
from raylf.methods import METHODS
from raylf.methods.base import MethodParams
from raylf.methods.fedavg_se import FedAvgSE

WAIT_S = 120.0


def hold(gate: Path, note: str = "") -> None:
    """Open ``gate`` once: create it, then wait for its release file (else pass through)."""
    try:
        with gate.open("x") as f:
            f.write(note)
    except FileExistsError:
        return
    release = gate.with_name(gate.name + ".release")
    deadline = time.monotonic() + WAIT_S
    while not release.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate} was never released")
        time.sleep(0.05)


def worker_name() -> str:
    """The training worker's actor name (``<trial id>/<attempt>/worker-N``), or, for a trial
    that trains in its own process (one worker: no worker actor), ``<trial id>/inline``."""
    import ray
    from ray import tune

    return (ray.get_runtime_context().get_actor_name()
            or f"{tune.get_context().get_trial_name()}/inline")


class GatedParams(MethodParams):
    gate_round: int = Field(ge=1)
    gate_file: str
    kill_worker: bool = False


class GatedFedAvgSE(FedAvgSE):
    name = "gated_fedavg_se"
    Params = GatedParams

    def local_update(self, client):
        gate = Path(self.params.gate_file)
        if client.rnd == self.params.gate_round and not gate.exists():
            import ray

            actor = worker_name()
            if self.params.kill_worker:
                gate.write_text(actor)
                ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
                time.sleep(WAIT_S)  # the kill lands while this round is in flight
                raise TimeoutError(f"worker {actor} was not killed")
            hold(gate, f"{actor}\n{ray.get_runtime_context().get_node_id()}")
        return super().local_update(client)


if "gated_fedavg_se" not in METHODS:
    METHODS.register("gated_fedavg_se")(GatedFedAvgSE)

if os.environ.get("RAYLF_TABLE_GATE") and not getattr(results.write_table, "gated", False):
    _write_table = results.write_table

    def write_table(root, table_name, trial_id, table):
        if table_name == "trials" and table.column("status")[0].as_py() != results.STARTED:
            hold(Path(os.environ["RAYLF_TABLE_GATE"]), trial_id)
        return _write_table(root, table_name, trial_id, table)

    write_table.gated = True
    results.write_table = write_table

if os.environ.get("RAYLF_DROP_GATE") and not getattr(checkpoints.drop_resume_state, "gated",
                                                     False):
    _drop_resume_state = checkpoints.drop_resume_state

    def drop_resume_state(root, trial_id, tune_trial_dir, keep_final_states):
        _drop_resume_state(root, trial_id, tune_trial_dir, keep_final_states)
        hold(Path(os.environ["RAYLF_DROP_GATE"]), trial_id)

    drop_resume_state.gated = True
    checkpoints.drop_resume_state = drop_resume_state
