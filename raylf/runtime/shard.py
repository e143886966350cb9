"""A client worker's logic: hosts a shard of virtual clients and runs their client half.

The data, the personal state and one reusable model stay resident here for the whole
experiment; a round only moves the broadcast in and the stacked uploads out.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from raylf.methods.base import score
from raylf.runtime.blueprint import Blueprint, pick_device
from raylf.seeding import derive
from raylf.training import tensor_bytes


class ClientShard:
    def __init__(self, blueprint: Blueprint, client_ids: np.ndarray, threads: int | None = None):
        if threads:
            torch.set_num_threads(threads)
        self.device = pick_device()
        self.seed = blueprint.spec.seed
        self.divergence_loss = blueprint.spec.federation.divergence_loss
        self.method = blueprint.method()
        self.trainer = blueprint.trainer(self.device)
        self.data = blueprint.federation.shard(client_ids, self.device)
        self.n_train = blueprint.federation.n_train
        init = blueprint.initial_vector().to(self.device)
        self.personal: dict[int, Any] = {}
        if self.method.personal_state:
            self.personal = {int(c): self.method.client_init(int(c), init) for c in client_ids}

    def _to_device(self, payload: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device) for k, v in payload.items()}

    def train(self, rnd: int, payload: dict[str, torch.Tensor], client_ids: np.ndarray,
              extras: dict[int, Any]) -> dict[str, Any]:
        """Local updates of ``client_ids`` (ascending); uploads come back stacked per key, the
        method's ``averaged`` keys as one sum Σ n_k·v_k over these clients."""
        payload = self._to_device(payload)
        uploads: dict[str, list[torch.Tensor]] = {}
        sums: dict[str, torch.Tensor] = {}
        losses, steps, up_bytes, metrics = [], [], [], []
        for cid in map(int, client_ids):
            update = self.method.local_update(
                self.trainer, payload, self.personal.get(cid), self.data.client(cid),
                derive(self.seed, "client", rnd, cid), extras.get(cid))
            if self.method.personal_state:
                self.personal[cid] = update.personal
            for key, tensor in update.upload.items():
                if key in self.method.averaged:  # float64: the same sum however it is split
                    term = float(self.n_train[cid]) * tensor.double()
                    sums[key] = sums[key] + term if key in sums else term
                else:
                    uploads.setdefault(key, []).append(tensor)
            losses.append(update.fit.loss)
            steps.append(update.fit.steps)
            up_bytes.append(tensor_bytes(update.upload))
            metrics.append(update.metrics)
            if not math.isfinite(update.fit.loss) or update.fit.loss > self.divergence_loss:
                break  # diverged: the coordinator stops the experiment at this round
        done = np.asarray(client_ids[: len(losses)], dtype=np.int64)
        return {
            "client_ids": done,
            "loss": np.asarray(losses, dtype=np.float64),
            "steps": np.asarray(steps, dtype=np.int64),
            "bytes_up": np.asarray(up_bytes, dtype=np.int64),
            "metrics": metrics,
            "uploads": {k: torch.stack(v).cpu() for k, v in uploads.items()},
            "sums": {k: v.cpu() for k, v in sums.items()},
        }

    def evaluate(self, rnd: int, payload: dict[str, torch.Tensor], client_ids: np.ndarray,
                 extras: dict[int, Any]) -> list[dict[str, Any]]:
        """``client_ids`` (a contiguous run of hosted clients), each on its own test split with
        its deployable model."""
        payload = self._to_device(payload)
        ids = [int(c) for c in client_ids]
        if not ids:
            return []
        if self.method.shared_deployable:  # one forward pass over the whole block
            self.trainer.load(self.method.deployable(payload, None, None))
            block = self.data.test_rows(client_ids)
            logits = self.trainer.predict(self.data.test.x[block])
            y = self.data.test.y[block]
            per_client = []
            for c in ids:
                rows = self.data.test.rows(self.data.position[c])
                rows = slice(rows.start - block.start, rows.stop - block.start)
                per_client.append([score(logits[rows], y[rows])])
        else:
            per_client = [self.method.evaluate(self.trainer, payload, self.personal.get(c),
                                               self.data.client(c), extras.get(c)) for c in ids]
        groups = self.data.groups
        return [{"round": rnd, "client_id": c, "group": int(groups[self.data.position[c]]),
                 "n_train": int(self.n_train[c]), **row}
                for c, client_rows in zip(ids, per_client) for row in client_rows]

    def personal_states(self) -> dict[int, Any]:
        return {c: _to_cpu(s) for c, s in self.personal.items()}

    def load_personal_states(self, states: dict[int, Any]) -> None:
        for cid, state in states.items():
            self.personal[int(cid)] = _to_device(state, self.device)


def _to_cpu(state: Any) -> Any:
    return _map_tensors(state, lambda t: t.cpu())


def _to_device(state: Any, device: torch.device) -> Any:
    return _map_tensors(state, lambda t: t.to(device))


def _map_tensors(state: Any, fn) -> Any:
    if torch.is_tensor(state):
        return fn(state)
    if isinstance(state, dict):
        return {k: _map_tensors(v, fn) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_map_tensors(v, fn) for v in state)
    return state
