"""Workloads, the floor loop and the measuring instruments of the raylf benchmark.

Importable as ``benchmarks.workloads`` (the repository root on ``sys.path``): Ray workers import
it by reference when they unpickle the image source's parameters or the timed shard, so the
driver puts the repository root on ``PYTHONPATH`` before it starts Ray.
"""

from __future__ import annotations

import copy
import importlib
import json
import math
import os
import threading
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from raylf.config import ResolvedSpec, validate
from raylf.data import sources
from raylf.data.federation import Federation, build_federation
from raylf.data.sources import SourceData
from raylf.runtime.blueprint import Blueprint
from raylf.runtime.coordinator import balance
from raylf.runtime.ray_backend import RayShard
from raylf.runtime.shard import ClientShard
from raylf.schema import set_path
from raylf.seeding import derive, stream
from raylf.training.rewrites import rewrite_for_training
from raylf.training.sequential import seed_global


def _psutil():
    """psutil; Ray vendors it under ray/thirdparty_files, on sys.path once Ray is imported."""
    try:
        return importlib.import_module("psutil")
    except ImportError:
        importlib.import_module("ray")
        return importlib.import_module("psutil")


psutil = _psutil()

# --------------------------------------------------------------------------- image source


class SyntheticImagesParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n_samples: int = Field(4000, ge=2)
    channels: int = Field(3, ge=1)
    size: int = Field(32, ge=4)
    num_classes: int = Field(10, ge=2)
    separation: float = Field(0.03, gt=0)
    seed: int = Field(0, ge=0)


class SyntheticImages:
    """Gaussian-mixture classes shaped as C×size×size images (smooth class templates + noise)."""

    Params = SyntheticImagesParams

    @staticmethod
    def load(params: SyntheticImagesParams) -> SourceData:
        rng = np.random.default_rng(params.seed)
        c, s, k = params.channels, params.size, params.num_classes
        coarse = rng.normal(0, params.separation, (k, c, 4, 4))
        templates = np.kron(coarse, np.ones((1, 1, s // 4, s // 4)))  # blocky, learnable by convs
        y = rng.integers(0, k, params.n_samples)
        x = templates[y] + rng.normal(0, 1, (params.n_samples, c, s, s))
        names = [f"class{i}" for i in range(k)]
        return SourceData(x.astype(np.float32), y.astype(np.int64), k, names)


def register_sources() -> None:
    if "synthetic_images" not in sources.SOURCES.names():
        sources.SOURCES.register("synthetic_images")(SyntheticImages)


register_sources()

# --------------------------------------------------------------------------- specs

TINY = {  # overhead-dominated: MLP on digits, 20 clients, half of them per round
    "name": "bench_tiny", "seed": 0,
    "dataset": {"name": "digits"},
    "scenario": {"name": "label_subset", "k": 2, "test_fraction": 0.25},
    "model": {"name": "mlp", "hidden": [64]},
    "method": {"name": "fedavg"},
    "federation": {"num_clients": 20, "participation": 0.5, "rounds": 30, "local_epochs": 1,
                   "batch_size": 16, "optimizer": {"lr": 0.05, "momentum": 0.9}},
    "eval_every": 5,
}

# issue 32's W1: TINY with batch 32 and plain SGD (no momentum), the shape measured against
# Flower; fewer, larger steps than TINY, so Ray's per-round cost weighs more
W1 = {**TINY, "name": "bench_w1",
      "federation": {**TINY["federation"], "batch_size": 32, "optimizer": {"lr": 0.05}}}

HEAVY = {  # compute-heavy: the FMT-SVM CNN on 3×32×32 synthetic images
    "name": "bench_heavy", "seed": 0,
    "dataset": {"name": "synthetic_images", "n_samples": 12000, "separation": 0.1},
    "scenario": {"name": "dirichlet", "alpha": 0.5, "test_fraction": 0.25},
    "model": {"name": "cnn", "channels": [16, 32], "features": 128},
    "method": {"name": "fedavg"},
    "federation": {"num_clients": 20, "participation": 0.5, "rounds": 6, "local_epochs": 1,
                   "batch_size": 32, "optimizer": {"lr": 0.05, "momentum": 0.9}},
    "eval_every": 3,
}

SAMPLES_PER_CLIENT = 40


def scaling_spec(num_clients: int, participants: int, rounds: int) -> dict[str, Any]:
    """fedavg on the flat synthetic source, fixed samples per client and participants per round."""
    return {
        "name": f"bench_scale_{num_clients}", "seed": 0,
        "dataset": {"name": "synthetic", "n_samples": SAMPLES_PER_CLIENT * num_clients,
                    "n_features": 32},
        "scenario": {"name": "iid", "test_fraction": 0.25},
        "model": {"name": "mlp", "hidden": [64]},
        "method": {"name": "fedavg"},
        "federation": {"num_clients": num_clients, "participation": participants / num_clients,
                       "rounds": rounds, "local_epochs": 1, "batch_size": 16,
                       "optimizer": {"lr": 0.05, "momentum": 0.9}},
        "eval_every": rounds,
    }


def with_fields(base: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A deep copy of ``base`` with fields set by path, ``federation__rounds=3`` style."""
    raw = copy.deepcopy(base)
    for key, value in fields.items():
        set_path(raw, key.replace("__", "."), value)
    return raw


def make_spec(base: dict[str, Any], *, workers: int = 1, cpus_per_worker: float = 1.0,
              gpus_per_worker: float = 0.0, cohort: str | int = "auto",
              **fields: Any) -> ResolvedSpec:
    """The validated spec of ``base`` with these resources and field overrides."""
    raw = with_fields(base, **fields)
    raw["resources"] = {"workers": workers, "cpus_per_worker": cpus_per_worker,
                        "gpus_per_worker": gpus_per_worker, "coordinator_cpus": 0.25,
                        "round_timeout_s": 600.0, "cohort": cohort}
    return validate(raw)


def participants_of(spec: ResolvedSpec) -> np.ndarray:
    """R×M: exactly the clients raylf's ``Method.select`` draws in rounds 1..R."""
    n, m = spec.federation.num_clients, spec.federation.participants_per_round()
    return np.stack([np.sort(stream(spec.seed, "participation", r).choice(n, m, replace=False))
                     for r in range(1, spec.federation.rounds + 1)])


def export_npz(spec: ResolvedSpec, path, cpus_per_client: float = 1.0) -> None:
    """A peer side's workload file (benchmarks/flower_side.py: the mlp; benchmarks/pfl_side.py:
    mlp and cnn): identical data, partition, participants, initial weights and hyperparameters.
    ``x`` is stored flat; ``config["input_shape"]`` gives each sample's shape."""
    if spec.model.name not in ("mlp", "cnn") or spec.method.name != "fedavg":
        raise ValueError("the peer workload covers fedavg with the mlp or cnn model")
    fed = build_federation(spec)
    source = sources.load_source(spec.dataset.name, spec.dataset_params)
    bp = Blueprint(spec, fed)
    names = [s.name for s in bp.layout.slots]
    assert all(s.is_param for s in bp.layout.slots), names  # weights and biases only, no buffers
    fcfg = spec.federation
    mp = spec.model_params
    arch = {"hidden": list(mp.hidden)} if spec.model.name == "mlp" else \
        {"channels": list(mp.channels), "features": mp.features}
    config = {"model": spec.model.name, **arch, "input_shape": list(fed.input_shape),
              "num_classes": fed.num_classes,
              "rounds": fcfg.rounds, "local_epochs": fcfg.local_epochs,
              "batch_size": fcfg.batch_size, "lr": fcfg.optimizer.lr,
              "momentum": fcfg.optimizer.momentum,
              "weight_decay": fcfg.optimizer.weight_decay, "seed": spec.seed,
              "cpus_per_client": cpus_per_client, "layout": names}
    arrays = {f"train_idx_{k}": np.asarray(i, dtype=np.int64) for k, i in enumerate(fed.train)}
    arrays.update({f"test_idx_{k}": np.asarray(i, dtype=np.int64) for k, i in enumerate(fed.test)})
    x = normalized_inputs(fed, source).numpy()
    np.savez(path, x=x.reshape(len(x), -1).astype(np.float32),
             y=source.y.astype(np.int64), participants=participants_of(spec),
             init=bp.initial_vector().numpy().astype(np.float32),
             config=np.array(json.dumps(config)), **arrays)


def balance_bound(spec: ResolvedSpec, fed: Federation | None = None) -> float:
    """Best possible per-round ratio to one worker with the runtime's split of participants.

    Median over rounds after the first of (training samples on the busiest worker) / (all
    training samples of the round's participants): a round lasts as long as its busiest
    worker. With sharded data the split follows the clients' homes, which random
    participation rarely makes even; with replicated data it is the coordinator's balanced
    split.
    """
    fed = fed or build_federation(spec)
    bp = Blueprint(spec, fed)
    shards, n = bp.shards(), fed.n_train

    def busiest(p: np.ndarray) -> int:
        if bp.replicated:
            return max(n[ids].sum() for ids in balance(p, n[p], len(shards)).values())
        return max(n[np.intersect1d(p, s)].sum() for s in shards)

    return median_after_first([busiest(p) / n[p].sum() for p in participants_of(spec)])


# --------------------------------------------------------------------------- the floor


def floor_run(spec: ResolvedSpec, fed: Federation | None = None,
              device: str = "cpu", torch_seed: bool = False,
              raylf_layout: bool = False) -> dict[str, Any]:
    """The identical experiment as a plain single-process PyTorch loop (no raylf runtime).

    Same partition, input normalization, participants, initial weights, per-client shuffle seeds,
    SGD, n_k-weighted average (a running float64 Σ n_k·w_k, divided once) and evaluation
    schedule as raylf's fedavg; returns per-round wall times and the final per-client accuracies.
    ``raylf_layout`` rewrites the model as raylf's trainer does
    (``raylf.training.rewrites.rewrite_for_training``: max-pools before the ReLUs they follow; on
    a CPU, channels-last convolutions for models that ask for it): the same arithmetic.
    """
    fed = fed or build_federation(spec)
    source = sources.load_source(spec.dataset.name, spec.dataset_params)
    dev = torch.device(device)
    x_all = normalized_inputs(fed, source)
    y_all = torch.from_numpy(source.y)
    train = [(x_all[i].to(dev), y_all[i].to(dev)) for i in fed.train]
    test_idx = np.concatenate(fed.test)
    x_test, y_test = x_all[test_idx].to(dev), y_all[test_idx].to(dev)
    test_off = np.concatenate([[0], np.cumsum([len(i) for i in fed.test])])
    n_train = torch.tensor([len(i) for i in fed.train], dtype=torch.float32)

    model = Blueprint(spec, fed).build_model().to(dev)  # raylf's seeded init, same weights
    if raylf_layout:
        rewrite_for_training(model, dev)
    params = list(model.parameters())
    global_vec = torch.nn.utils.parameters_to_vector(params).detach().clone()
    fcfg = spec.federation
    opt_cfg = fcfg.optimizer
    parts = participants_of(spec)
    round_s, accs = [], None
    for rnd in range(1, fcfg.rounds + 1):
        t0 = time.perf_counter()
        ids = parts[rnd - 1]
        total = None
        for cid in ids:
            load_(params, global_vec)
            opt = torch.optim.SGD(params, lr=opt_cfg.lr, momentum=opt_cfg.momentum,
                                  weight_decay=opt_cfg.weight_decay)
            seed = derive(spec.seed, "client", rnd, int(cid))
            gen = torch.Generator().manual_seed(seed)
            if torch_seed:  # the usual call; it also pays lazy accelerator bookkeeping
                torch.manual_seed(seed)
            else:  # the same CPU stream, seeded the way raylf's trainer does it
                seed_global(seed, dev)
            x, y = train[cid]
            model.train()
            for _ in range(fcfg.local_epochs):
                order = torch.randperm(len(y), generator=gen).to(dev)
                for start in range(0, len(y), fcfg.batch_size):
                    idx = order[start: start + fcfg.batch_size]
                    loss = F.cross_entropy(model(x[idx]), y[idx])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
            vec = torch.nn.utils.parameters_to_vector(params).detach().double()
            total = n_train[cid].item() * vec + (0 if total is None else total)
        global_vec = (total / float(n_train[ids].sum())).float()
        if rnd % spec.eval_every == 0 or rnd == fcfg.rounds:
            load_(params, global_vec)
            model.eval()
            with torch.no_grad():
                pred = torch.cat([model(x_test[i: i + 4096]).argmax(1)
                                  for i in range(0, len(y_test), 4096)])
            hit = (pred == y_test).cpu().numpy()
            accs = [float(hit[test_off[k]: test_off[k + 1]].mean()) if test_off[k + 1] > test_off[k]
                    else None for k in range(fed.num_clients)]
        if dev.type == "cuda":
            torch.cuda.synchronize()
        round_s.append(time.perf_counter() - t0)
    return {"round_s": round_s, "final_acc_per_client": accs}


def trains_channels_last(spec: ResolvedSpec, device: str = "cpu") -> bool:
    """Whether raylf's trainer runs this spec's model on channels-last activations here."""
    model = Blueprint(spec, build_federation(spec)).build_model()
    return device == "cpu" and model.channels_last_on_cpu


def normalized_inputs(fed: Federation, source: SourceData) -> torch.Tensor:
    """Every input of the source as the federation's shards see it (``dataset.normalize``,
    with the statistics of its training split), in a copy: the source's arrays stay as loaded."""
    return fed.normalization.apply(torch.tensor(source.x))


@torch.no_grad()
def load_(params: list[torch.Tensor], vector: torch.Tensor) -> None:
    """Copy a flat vector into the parameters (vector_to_parameters would alias it)."""
    offset = 0
    for p in params:
        p.copy_(vector[offset: offset + p.numel()].view_as(p))
        offset += p.numel()


# --------------------------------------------------------------------------- instruments


def median_after_first(values: list[float]) -> float:
    rest = values[1:] if len(values) > 1 else values
    return float(np.median(rest))


RAY_SERVICES = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


class RssSampler:
    """Peak Σ memory over this process and all its descendants (Ray's raylet, workers, …).

    ``peak_workers``: Σ RSS of the driver plus every Ray worker process (``ray::IDLE`` and
    actors); ``peak_all``: Σ RSS of every descendant (GCS, raylet, agents as well);
    ``peak_pss``: Σ PSS of every descendant (shared library pages split between the processes
    that map them, so libtorch counts once: the machine's real footprint).
    """

    def __init__(self, interval: float = 0.25):
        self.interval = interval
        self.peak_workers = self.peak_all = self.peak_pss = 0
        self.breakdown: dict[str, int] = {}  # MiB RSS by process kind at the peak
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._me = psutil.Process(os.getpid())

    def sample(self) -> None:
        procs = [self._me]
        try:
            procs += self._me.children(recursive=True)
        except psutil.Error:
            pass
        total = workers = pss = 0
        parts: dict[str, int] = {}
        for p in procs:
            try:
                info = p.memory_full_info()
                name = p.name()
            except psutil.Error:
                continue
            total += info.rss
            pss += getattr(info, "pss", info.rss)
            if p is self._me or (name.startswith("ray::") and name not in RAY_SERVICES):
                workers += info.rss
                key = "driver" if p is self._me else name.split(".")[0].removeprefix("ray::")
                parts[key] = parts.get(key, 0) + info.rss
        if workers > self.peak_workers:
            self.breakdown = {k: round(v / 2**20) for k, v in sorted(parts.items())}
        self.peak_all = max(self.peak_all, total)
        self.peak_workers = max(self.peak_workers, workers)
        self.peak_pss = max(self.peak_pss, pss)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


# --------------------------------------------------------------------------- phase probe


class TimedShard(ClientShard):
    """A ClientShard that also reports how long its train call and its local fits took."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._fit_s = 0.0
        self.trainer.fit = self._timed(self.trainer.fit)
        if self.cohort is not None:  # lockstep training: the cohort's fit is the local SGD
            self.cohort.fit = self._timed(self.cohort.fit)

    def _timed(self, fit):
        def timed_fit(*a, **k):
            t0 = time.perf_counter()
            try:
                return fit(*a, **k)
            finally:
                self._fit_s += time.perf_counter() - t0

        return timed_fit

    def train(self, *args, **kwargs):
        self._fit_s = 0.0
        t0 = time.perf_counter()
        out = super().train(*args, **kwargs)
        out["timing"] = {"shard_s": time.perf_counter() - t0, "fit_s": self._fit_s}
        return out

    def evaluate(self, *args, **kwargs):
        t0 = time.perf_counter()
        rows = super().evaluate(*args, **kwargs)
        if rows:
            rows[0] = {**rows[0], "_eval_s": time.perf_counter() - t0}
        return rows


class TimedRayShard(TimedShard, RayShard):
    """TimedShard with the Ray backend's wire format (what a Ray worker really runs)."""


class PhaseClock:
    """Wraps a Coordinator (driver-side) and accumulates per-round phase times."""

    PHASES = ("dispatch_s", "fit_s", "client_loop_s", "aggregate_s", "evaluate_s", "other_s")

    def __init__(self, coordinator):
        self.coord = coordinator
        self.rows: list[dict[str, float]] = []
        self._cur: dict[str, float] = {}
        pool, method = coordinator.pool, coordinator.method
        train, evaluate, aggregate, gather = (pool.train, coordinator.evaluate,
                                              method.aggregate, coordinator._gather)

        def timed_train(*a, **k):
            t0 = time.perf_counter()
            results = train(*a, **k)
            wall = time.perf_counter() - t0
            slowest = max(results, key=lambda r: r["timing"]["shard_s"])["timing"]
            self._cur["fit_s"] += slowest["fit_s"]
            self._cur["client_loop_s"] += slowest["shard_s"] - slowest["fit_s"]
            self._cur["dispatch_s"] += wall - slowest["shard_s"]
            for r in results:
                r.pop("timing")
            return results

        def timed(name, fn):
            def inner(*a, **k):
                t0 = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    self._cur[name] += time.perf_counter() - t0
            return inner

        pool.train = timed_train
        coordinator.evaluate = timed("evaluate_s", evaluate)
        method.aggregate = timed("aggregate_s", aggregate)
        coordinator._gather = timed("aggregate_s", gather)

    def run_round(self, rnd: int):
        self._cur = dict.fromkeys(self.PHASES, 0.0)
        t0 = time.perf_counter()
        outcome = self.coord.run_round(rnd)
        wall = time.perf_counter() - t0
        self._cur["other_s"] = wall - sum(self._cur.values())
        self._cur["round_s"] = wall
        self.rows.append(self._cur)
        return outcome

    def medians(self) -> dict[str, float]:
        rows = self.rows[1:] if len(self.rows) > 1 else self.rows
        return {k: float(np.median([r[k] for r in rows])) for k in (*self.PHASES, "round_s")}


def nan_if_none(v: Any) -> float:
    return math.nan if v is None else float(v)
