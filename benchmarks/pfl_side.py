"""pfl-research side of the raylf benchmark: the same FedAvg workload on Apple's ``pfl`` simulator.

Runs inside the isolated pfl venv (see ``setup_peer_venv.sh pfl``); it must not import raylf.

    python benchmarks/pfl_side.py --workload W.npz --out R.json [--processes 2]

The workload file is the one the Flower side reads (``workloads.export_npz``): ``x`` (float32,
N x F, reshaped here to ``config["input_shape"]``), ``y``, ``train_idx_<k>`` / ``test_idx_<k>``,
``participants`` (R x M, row r - 1 = the clients of round r), ``init`` (the flat initial
parameters in raylf's layout order, named in ``config["layout"]``) and ``config`` (JSON: model,
hyperparameters, seed).

How the workload maps onto pfl (0.6.0):

* the model is a ``torch.nn.Module`` with raylf's module tree (so its parameter names equal
  ``config["layout"]``, checked), given ``loss`` and ``metrics`` methods and wrapped in pfl's
  ``PyTorchModel``; the local optimizer is torch's SGD with the workload's momentum and weight
  decay, created afresh for each client by pfl; the central optimizer is SGD with lr 1, so the
  averaged model difference is added to the global model as is (FedAvg);
* the clients live in a pfl ``FederatedDataset``: its user sampler hands out the exported
  participants in order (round 1's M clients, then round 2's, ...), and its dataset factory
  builds each sampled client's ``PyTorchTensorDataset`` in the order of the shuffle raylf uses
  for that client and round (``derive_seed(seed, "client", r, k)``). pfl's own batching then
  walks it in slices of ``batch_size``, the last partial batch kept, as raylf and the floor do;
* pfl's ``FederatedAveraging`` over a ``SimulatedBackend`` with ``WeightByDatapoints`` does the
  rounds: each client's update is weighted by its number of training samples, as raylf's fedavg
  weights by n_k. pfl aggregates model *differences* in float32 (the floor sums n_k * w_k in
  float64), so the global models agree up to float rounding;
* with ``--processes P > 1`` the script relaunches itself under ``torchrun`` (P processes, gloo):
  pfl then gives each process every P-th client of the cohort and all-reduces the sums;
* evaluation: pfl evaluates each trained client on its own training data in the first round
  (``NNAlgorithmParams`` evaluates at iteration 0 whatever the frequency); after the last round
  the final global model is evaluated with pfl's ``PyTorchModel.evaluate`` on every client's
  test split.

Output JSON (the Flower side's shape): pfl_version, torch_version, wall_s (``algorithm.run``:
all rounds, from the first sampled client to the last model update), round_s (per round: the
gap between consecutive end-of-round callbacks, the first from the start of ``run``),
final_acc_per_client, acc_mean (unweighted mean over clients), plus diagnostics.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
import warnings
from importlib.metadata import version
from typing import Any

# pfl picks CUDA when it sees one; the floor and raylf's rows here run on the CPU.
os.environ.setdefault("PFL_PYTORCH_DEVICE", "cpu")
# pfl 0.6.0's all-reduce uses torch.distributed.reduce_op, deprecated in recent torch
warnings.filterwarnings("ignore", message=r".*reduce_op. is deprecated", category=FutureWarning)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from peer_workload import PeerNet, derive_seed, initial_net, load_workload  # noqa: E402

# --------------------------------------------------------------------------- workload / model


class Net(PeerNet):
    """The peers' network with the ``loss`` and ``metrics`` methods pfl's PyTorchModel calls."""

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.train()
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
        from pfl.metrics import Weighted

        self.eval()
        logits = self(x)
        return {"accuracy": Weighted(float((logits.argmax(1) == y).sum()), len(y)),
                "loss": Weighted(float(F.cross_entropy(logits, y, reduction="sum")), len(y))}


# --------------------------------------------------------------------------- pfl pieces


class ExportedParticipants:
    """pfl user sampler: each call returns the next (round, client) of the exported schedule."""

    def __init__(self, participants: np.ndarray):
        self._order = [(r + 1, int(k)) for r, row in enumerate(participants) for k in row]
        self._next = 0

    def __call__(self) -> tuple[int, int]:
        if self._next == len(self._order):
            raise RuntimeError("pfl asked for more clients than the schedule holds")
        user = self._order[self._next]
        self._next += 1
        return user


def run(workload: str, threads: int) -> dict[str, Any]:
    torch.set_num_threads(threads)
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.pytorch import PyTorchTensorDataset
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.internal.ops import pytorch_ops
    from pfl.metrics import Metrics
    from pfl.model.pytorch import PyTorchModel

    t_setup = time.perf_counter()
    wl = load_workload(os.path.abspath(workload))
    cfg = wl["config"]
    x, y, seed = wl["x"], wl["y"], int(cfg["seed"])
    rounds, cohort = wl["participants"].shape

    def client_dataset(user: tuple[int, int]) -> PyTorchTensorDataset:
        rnd, k = user
        idx = wl["train_idx"][k]
        gen = torch.Generator().manual_seed(derive_seed(seed, "client", rnd, k))
        order = idx[torch.randperm(len(idx), generator=gen)]
        return PyTorchTensorDataset((x[order], y[order]), user_id=f"{k}@{rnd}")

    train_data = FederatedDataset(client_dataset, ExportedParticipants(wl["participants"]))
    # no validation cohort (val_cohort_size=None): SimulatedBackend still asks for one
    backend = SimulatedBackend(training_data=train_data, val_data=train_data,
                               postprocessors=[WeightByDatapoints()])
    net = initial_net(wl, Net)
    model = PyTorchModel(
        model=net,
        local_optimizer_create=functools.partial(
            torch.optim.SGD, momentum=float(cfg["momentum"]),
            weight_decay=float(cfg.get("weight_decay", 0.0))),
        central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
    train_params = NNTrainHyperParams(local_num_epochs=int(cfg["local_epochs"]),
                                      local_learning_rate=float(cfg["lr"]),
                                      local_batch_size=int(cfg["batch_size"]))
    algo_params = NNAlgorithmParams(central_num_iterations=rounds, evaluation_frequency=rounds,
                                    train_cohort_size=cohort, val_cohort_size=None)
    stamps: list[float] = []

    class RoundClock(TrainingProcessCallback):
        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            stamps.append(time.perf_counter())
            return False, Metrics()

    setup_s = time.perf_counter() - t_setup
    t0 = time.perf_counter()
    model = FederatedAveraging().run(algorithm_params=algo_params, backend=backend, model=model,
                                     model_train_params=train_params, callbacks=[RoundClock()],
                                     send_metrics_to_platform=False)
    wall_s = time.perf_counter() - t0
    if len(stamps) != rounds:
        raise RuntimeError(f"pfl ran {len(stamps)} of {rounds} rounds")

    t_eval = time.perf_counter()
    accs: list[float | None] = []
    for idx in wl["test_idx"]:
        if len(idx) == 0:
            accs.append(None)
            continue
        metrics = model.evaluate(PyTorchTensorDataset((x[idx], y[idx])),
                                 eval_params=NNEvalHyperParams(local_batch_size=None))
        accs.append(float(metrics["accuracy"].overall_value))
    valid = [a for a in accs if a is not None]
    dist = pytorch_ops.distributed
    return {
        "pfl_version": version("pfl"),
        "torch_version": torch.__version__,
        "wall_s": wall_s,
        "round_s": list(np.diff([t0, *stamps])),
        "final_acc_per_client": accs,
        "acc_mean": float(np.mean(valid)) if valid else None,
        # diagnostics beyond the common schema
        "processes": dist.world_size if dist is not None else 1,
        "threads_per_process": torch.get_num_threads(),
        "setup_s": setup_s,
        "final_eval_s": time.perf_counter() - t_eval,
        "num_clients": len(wl["train_idx"]),
        "cohort": int(cohort),
        "device": str(pytorch_ops.get_default_device()),
    }


# --------------------------------------------------------------------------- driver


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True, help="input .npz workload")
    parser.add_argument("--out", required=True, help="output JSON file")
    parser.add_argument("--processes", type=int, default=1,
                        help="simulation processes (> 1: relaunch under torchrun, gloo)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    args = parser.parse_args(argv)

    if args.processes > 1 and "TORCHELASTIC_RUN_ID" not in os.environ:
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={args.processes}", os.path.abspath(__file__),
               "--workload", args.workload, "--out", args.out, "--threads", str(args.threads)]
        subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
        with open(args.out) as f:
            result = json.load(f)
        result["launch_wall_s"] = time.perf_counter() - t0
    else:
        result = run(args.workload, args.threads)
        if "TORCHELASTIC_RUN_ID" in os.environ:  # a process under torchrun
            if int(os.environ["RANK"]) == 0:  # every process holds the same final model
                with open(args.out, "w") as f:
                    json.dump(result, f)
            return 0
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps({k: result[k] for k in ("pfl_version", "processes", "wall_s", "acc_mean")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
