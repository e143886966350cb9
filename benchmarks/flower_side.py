"""Flower side of the raylf benchmark: the same FedAvg workload on Flower's simulation engine.

Runs inside the isolated Flower venv (see ``setup_peer_venv.sh flower``); it must not import raylf.

    python benchmarks/flower_side.py --workload W.npz --out R.json

The workload is fully given by the ``.npz`` file:

* ``x`` (float32, N x F, shaped by the config's ``input_shape``), ``y`` (int64, N);
* ``train_idx_<k>`` / ``test_idx_<k>`` for each client k = 0..K-1;
* ``participants`` (int64, R x M): row r - 1 holds the clients that train in round r = 1..R;
* ``init`` (float32): the flat initial parameters of raylf's mlp or cnn
  (``peer_workload.PeerNet``, the same module tree), in PyTorch layout and order;
* ``config``: a 0-d string array holding JSON with ``model``, ``hidden`` or ``channels`` and
  ``features``, ``num_classes``, ``rounds``, ``local_epochs``, ``batch_size``, ``lr``,
  ``momentum``, ``seed``, ``cpus_per_client``.

How it maps onto Flower (flwr 1.42, Message API):

* one virtual SuperNode per client; Flower gives each a random node id and the node config
  ``partition-id`` = k. The ServerApp first sends one QUERY message to every node to learn the
  node-id <-> partition-id mapping (the server side has no other public way to see it);
* a FedAvg subclass overrides ``configure_train`` so that round r sends TRAIN messages exactly to
  the nodes of ``participants[r]``; federated evaluation is switched off;
* each client trains ``local_epochs`` of minibatch SGD (fresh optimizer with momentum, mean
  cross-entropy, last partial batch kept), shuffled with a ``torch.Generator`` seeded by
  ``derive_seed(seed, "client", r, k)`` with r the 1-based round (Flower's server-round, and
  raylf's round number), so both sides shuffle identically; replies carry ``num-examples`` =
  n_train, and Flower's FedAvg aggregation averages weighted by it;
* after the simulation, the final global model is evaluated centrally on every client's test split.

Output JSON: flwr_version, ray_version, wall_s (the whole ``run_simulation`` call: Ray start-up,
actor pool, node discovery, all rounds, shutdown), round_s (per round: from sending the TRAIN
messages to the end of aggregation), final_acc_per_client, acc_mean (unweighted mean over
clients), plus a few extra diagnostic fields.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings
from typing import Any

# Quiet, offline-friendly defaults; set before Flower or Ray are imported. Ray >= 2.59 turns
# token authentication on by default; the Ray pinned by flwr may not, but this is harmless.
for _name, _value in (
    ("RAY_AUTH_MODE", "disabled"),
    ("FLWR_TELEMETRY_ENABLED", "0"),
    ("RAY_USAGE_STATS_ENABLED", "0"),
    ("RAY_DEDUP_LOGS", "0"),
    ("GRPC_VERBOSITY", "ERROR"),
):
    os.environ.setdefault(_name, _value)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from flwr.app import (  # noqa: E402
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from local_ray import warn_token_auth_off  # noqa: E402
from peer_workload import PeerNet, derive_seed, initial_net, load_workload  # noqa: E402
from torch import nn  # noqa: E402

PARTITION_ID = "partition-id"
NUM_EXAMPLES = "num-examples"


# --------------------------------------------------------------------------- workload / model


def check_model(wl: dict[str, Any]) -> None:
    """The initial weights fit the model the config describes (``initial_net`` raises)."""
    if float(wl["config"]["cpus_per_client"]) <= 0:
        raise ValueError("cpus_per_client must be > 0")
    initial_net(wl)


def train_local(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: dict[str, Any],
                generator: torch.Generator) -> None:
    """``local_epochs`` of minibatch SGD with momentum on mean cross-entropy."""
    opt = torch.optim.SGD(model.parameters(), lr=float(cfg["lr"]),
                          momentum=float(cfg["momentum"]))
    loss_fn = nn.CrossEntropyLoss()
    n, bs = x.shape[0], int(cfg["batch_size"])
    model.train()
    for _ in range(int(cfg["local_epochs"])):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, bs):
            batch = order[start:start + bs]
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x[batch]), y[batch]).backward()
            opt.step()


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float | None:
    if y.numel() == 0:
        return None
    model.eval()
    return float((model(x).argmax(dim=1) == y).float().mean())


# --------------------------------------------------------------------------- ClientApp

client_app = ClientApp()


@client_app.query()
def report_partition(msg: Message, context: Context) -> Message:
    """Tell the server which partition (raylf client id) this virtual node holds."""
    info = MetricRecord({PARTITION_ID: int(context.node_config[PARTITION_ID])})
    return Message(RecordDict({"info": info}), reply_to=msg)


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    cfg_rec = msg.content["config"]
    wl = load_workload(str(cfg_rec["workload"]))
    cfg = wl["config"]
    torch.set_num_threads(max(1, int(float(cfg["cpus_per_client"]))))

    client = int(context.node_config[PARTITION_ID])
    # The shuffle seed uses the 1-based round number, exactly as raylf does
    # (derive(seed, "client", rnd, cid) with rnd = 1..R); Flower's server-round is 1-based too.
    rnd = int(cfg_rec["server-round"])
    idx = wl["train_idx"][client]

    model = PeerNet(cfg, wl["input_shape"])
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    gen = torch.Generator().manual_seed(derive_seed(int(cfg["seed"]), "client", rnd, client))
    train_local(model, wl["x"][idx], wl["y"][idx], cfg, gen)

    reply = RecordDict({
        "arrays": ArrayRecord(model.state_dict()),
        "metrics": MetricRecord({NUM_EXAMPLES: int(idx.numel())}),
    })
    return Message(reply, reply_to=msg)


# --------------------------------------------------------------------------- ServerApp


class FixedParticipantsFedAvg(FedAvg):
    """FedAvg whose round r trains exactly the partitions listed in ``participants[r - 1]``."""

    def __init__(self, participants: np.ndarray, node_of_partition: dict[int, int]) -> None:
        super().__init__(fraction_train=1.0, fraction_evaluate=0.0,
                         min_train_nodes=0, min_available_nodes=0)
        self.participants = participants
        self.node_of_partition = node_of_partition
        self.round_s: list[float] = []
        self._round_start = 0.0

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> list[Message]:
        self._round_start = time.perf_counter()
        config["server-round"] = server_round
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return [
            Message(content, dst_node_id=self.node_of_partition[int(k)],
                    message_type=MessageType.TRAIN, group_id=str(server_round))
            for k in self.participants[server_round - 1]
        ]

    def aggregate_train(self, server_round: int, replies):  # type: ignore[override]
        replies = list(replies)
        expected = {self.node_of_partition[int(k)] for k in self.participants[server_round - 1]}
        failed = [m for m in replies if m.has_error()]
        got = {m.metadata.src_node_id for m in replies if not m.has_error()}
        if failed or got != expected:
            first = failed[0].error.reason.strip().splitlines()[-1][:300] if failed else ""
            raise RuntimeError(f"round {server_round}: {len(got)}/{len(expected)} clients "
                               f"replied ({len(failed)} errors; {first or 'missing replies'})")
        out = super().aggregate_train(server_round, replies)
        self.round_s.append(time.perf_counter() - self._round_start)
        return out


def discover_partitions(grid: Grid, num_clients: int, timeout: float) -> dict[int, int]:
    """Map partition id -> Flower node id by asking every virtual node."""
    deadline = time.monotonic() + timeout
    while len(node_ids := list(grid.get_node_ids())) < num_clients:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(node_ids)}/{num_clients} virtual nodes registered")
        time.sleep(0.05)
    messages = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY)
                for n in node_ids]
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    mapping: dict[int, int] = {}
    for reply in replies:
        if reply.has_error():
            raise RuntimeError(f"partition query failed: {reply.error.reason}")
        mapping[int(reply.content["info"][PARTITION_ID])] = reply.metadata.src_node_id
    if sorted(mapping) != list(range(num_clients)):
        raise RuntimeError(f"partition query answered for {sorted(mapping)}")
    return mapping


def make_server_app(workload: str, timeout: float, outcome: dict[str, Any]) -> ServerApp:
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        wl = load_workload(workload)
        t0 = time.perf_counter()
        node_of_partition = discover_partitions(grid, len(wl["train_idx"]), timeout)
        outcome["discovery_s"] = time.perf_counter() - t0

        strategy = FixedParticipantsFedAvg(wl["participants"], node_of_partition)
        t0 = time.perf_counter()
        result = strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(initial_net(wl).state_dict()),
            num_rounds=int(wl["config"]["rounds"]),
            timeout=timeout,
            train_config=ConfigRecord({"workload": workload}),
        )
        outcome["rounds_s"] = time.perf_counter() - t0
        outcome["round_s"] = strategy.round_s
        outcome["final_state"] = result.arrays.to_torch_state_dict()

    return server_app


# --------------------------------------------------------------------------- driver


def run(workload: str, num_cpus: float | None, timeout: float, verbose: bool) -> dict[str, Any]:
    import flwr
    import ray
    from flwr.simulation import run_simulation

    workload = os.path.abspath(workload)
    wl = load_workload(workload)
    check_model(wl)
    cfg = wl["config"]
    num_clients = len(wl["train_idx"])

    if not verbose:
        logging.getLogger("flwr").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"ray\.")
    # address="local": always start a fresh Ray here, never join a cluster someone else
    # started on this machine with `ray start` (ray.init() would otherwise connect to it).
    init_args: dict[str, Any] = {"address": "local", "logging_level": "ERROR",
                                 "log_to_driver": verbose, "include_dashboard": False}
    if num_cpus is not None:
        init_args["num_cpus"] = num_cpus
    backend_config = {
        "client_resources": {"num_cpus": float(cfg["cpus_per_client"]), "num_gpus": 0.0},
        "init_args": init_args,
    }

    outcome: dict[str, Any] = {}
    t0 = time.perf_counter()
    run_simulation(
        server_app=make_server_app(workload, timeout, outcome),
        client_app=client_app,
        num_supernodes=num_clients,
        backend_config=backend_config,
        verbose_logging=verbose,
    )
    wall_s = time.perf_counter() - t0
    if "final_state" not in outcome:
        raise RuntimeError("the Flower simulation ended without a final model")

    model = PeerNet(cfg, wl["input_shape"])
    model.load_state_dict(outcome["final_state"])
    accs = [accuracy(model, wl["x"][idx], wl["y"][idx]) for idx in wl["test_idx"]]
    valid = [a for a in accs if a is not None]
    return {
        "flwr_version": flwr.__version__,
        "ray_version": ray.__version__,
        "wall_s": wall_s,
        "round_s": outcome["round_s"],
        "final_acc_per_client": accs,
        "acc_mean": float(np.mean(valid)) if valid else None,
        # diagnostics beyond the common schema
        "rounds_total_s": outcome["rounds_s"],
        "discovery_s": outcome["discovery_s"],
        "num_clients": num_clients,
        "cpus_per_client": float(cfg["cpus_per_client"]),
        "torch_version": torch.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    warn_token_auth_off()
    parser.add_argument("--workload", required=True, help="input .npz workload")
    parser.add_argument("--out", required=True, help="output JSON file")
    parser.add_argument("--num-cpus", type=float, default=None,
                        help="CPUs Ray may use (default: Ray detects them)")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds to wait for one round's replies before failing")
    parser.add_argument("--verbose", action="store_true", help="show Flower and Ray logs")
    args = parser.parse_args(argv)

    result = run(args.workload, args.num_cpus, args.timeout, args.verbose)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps({k: result[k] for k in ("flwr_version", "ray_version", "wall_s", "acc_mean")}))
    return 0


if __name__ == "__main__":
    # Re-enter through the importable module so that cloudpickle ships the ClientApp's
    # functions to the Ray actors by reference (module ``flower_side`` on their PYTHONPATH,
    # which Flower sets from this process's sys.path) rather than by value; that lets each
    # actor keep its cached copy of the workload between messages.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import flower_side

    sys.exit(flower_side.main())
