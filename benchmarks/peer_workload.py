"""What every peer side (flower_side.py, pfl_side.py) reads the same way: the exported workload
(``workloads.export_npz``) and raylf's per-client, per-round seeds.

It runs in the peers' own venvs, which cannot import raylf, so it needs only NumPy and torch;
the peer scripts import it from their own folder (Flower's Ray actors get that folder on their
path with the script's module). The model is here too, so both peers train the same network.
"""

from __future__ import annotations

import functools
import json
import math
import zlib
from typing import Any

import numpy as np
import torch
from torch import nn


def derive_seed(seed: int, purpose: str, *indices: int) -> int:
    """A 63-bit torch seed from (seed, purpose, *indices), the scheme of raylf's streams
    (``raylf.seeding.derive``): a NumPy SeedSequence of [seed, crc32(purpose), *indices], its
    two 32-bit state words combined as (w0 << 31) ^ w1."""
    key = [int(seed), zlib.crc32(purpose.encode()), *(int(i) for i in indices)]
    w0, w1 = (int(w) for w in np.random.SeedSequence(key).generate_state(2, np.uint32))
    return (w0 << 31) ^ w1


@functools.lru_cache(maxsize=2)
def load_workload(path: str) -> dict[str, Any]:
    """The workload file, read once per process and checked: ``x`` shaped by the config's
    ``input_shape`` (flat features when absent), per-client train / test indices, the
    participants of every round, the initial weights."""
    with np.load(path, allow_pickle=False) as z:
        cfg = json.loads(str(z["config"][()]))
        num_clients = sum(1 for name in z.files if name.startswith("train_idx_"))
        shape = tuple(int(s) for s in cfg.get("input_shape", [z["x"].shape[1]]))
        x = np.ascontiguousarray(z["x"], dtype=np.float32).reshape(-1, *shape)
        wl = {
            "config": cfg, "input_shape": shape,
            "x": torch.from_numpy(x),
            "y": torch.from_numpy(np.ascontiguousarray(z["y"], dtype=np.int64)),
            "train_idx": [torch.from_numpy(z[f"train_idx_{k}"].astype(np.int64))
                          for k in range(num_clients)],
            "test_idx": [torch.from_numpy(z[f"test_idx_{k}"].astype(np.int64))
                         for k in range(num_clients)],
            "participants": z["participants"].astype(np.int64),
            "init": np.ascontiguousarray(z["init"], dtype=np.float32),
        }
    _check(wl)
    return wl


def _check(wl: dict[str, Any]) -> None:
    cfg, parts = wl["config"], wl["participants"]
    num_clients = len(wl["train_idx"])
    if num_clients == 0 or len(wl["test_idx"]) != num_clients:
        raise ValueError("workload needs train_idx_<k> and test_idx_<k> for k = 0..K-1")
    if parts.ndim != 2 or parts.shape[0] != int(cfg["rounds"]):
        raise ValueError(f"participants has shape {parts.shape}, "
                         f"expected (rounds={cfg['rounds']}, M)")
    if parts.size and (parts.min() < 0 or parts.max() >= num_clients):
        raise ValueError("participants holds a client id outside 0..K-1")
    for r, row in enumerate(parts):
        if len(set(row.tolist())) != len(row):
            raise ValueError(f"participants[{r}] repeats a client")
    if int(cfg["batch_size"]) < 1 or int(cfg["local_epochs"]) < 0:
        raise ValueError("batch_size must be >= 1 and local_epochs >= 0")


class PeerNet(nn.Module):
    """raylf's mlp / cnn as ``encoder`` + ``head`` (the same module tree, so the same parameter
    names and order as the exported initial weights)."""

    def __init__(self, cfg: dict[str, Any], input_shape: tuple[int, ...]):
        super().__init__()
        classes = int(cfg["num_classes"])
        if cfg.get("model", "mlp") == "mlp":
            layers: list[nn.Module] = [nn.Flatten()]
            width = math.prod(input_shape)
            for h in cfg["hidden"]:
                layers += [nn.Linear(width, int(h)), nn.ReLU()]
                width = int(h)
            self.encoder = nn.Sequential(*layers)
        elif cfg["model"] == "cnn":
            blocks: list[nn.Module] = []
            in_ch = input_shape[0]
            for ch in cfg["channels"]:
                blocks += [nn.Conv2d(in_ch, int(ch), 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
                in_ch = int(ch)
            convs = nn.Sequential(*blocks, nn.Flatten())
            with torch.no_grad():
                flat = convs(torch.zeros(1, *input_shape)).shape[1]
            width = int(cfg["features"])
            self.encoder = nn.Sequential(convs, nn.Linear(flat, width), nn.ReLU())
        else:
            raise ValueError(f"model {cfg['model']!r}: the peers build mlp and cnn")
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def initial_net(wl: dict[str, Any], cls: type[PeerNet] = PeerNet) -> PeerNet:
    """The workload's model (``cls``: a PeerNet subclass a peer needs) at its exported initial
    weights; ValueError if the parameters do not match the export's order or count."""
    net = cls(wl["config"], wl["input_shape"])
    names = [n for n, _ in net.named_parameters()]
    if "layout" in wl["config"] and names != list(wl["config"]["layout"]):
        raise ValueError(f"parameter order {names} differs from raylf's {wl['config']['layout']}")
    init = torch.from_numpy(wl["init"].copy())
    if init.numel() != sum(p.numel() for p in net.parameters()):
        raise ValueError(f"init has {init.numel()} values, the model another count")
    nn.utils.vector_to_parameters(init, net.parameters())
    return net
