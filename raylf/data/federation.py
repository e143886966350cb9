"""The federation of one experiment: who holds which samples, and each shard's resident tensors.

The partition is computed once from the labels (deterministic in the trial seed); a worker then
loads the source once and keeps only its own clients' samples, concatenated, with per-client
offsets, so a client's data is a pair of slices and evaluating a shared model is one pass.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
import torch

from raylf.data.normalize import Normalization, normalization_for
from raylf.data.ragged import Ragged
from raylf.data.scenarios import (
    Incompatible,
    check_compatible,
    make_partition,
    split_train_test,
    split_validation,
)
from raylf.data.sources import SourceData, load_source
from raylf.errors import SpecError
from raylf.seeding import stream


@dataclass(frozen=True)
class Federation:
    dataset: str
    dataset_params: object
    train: Ragged  # per-client sample indices; reads like a list of arrays
    test: Ragged
    groups: np.ndarray
    angles: np.ndarray | None
    input_shape: tuple[int, ...]
    num_classes: int
    tasks: tuple[str, ...] = ()
    label_maps: np.ndarray | None = None  # clients × classes: label seen for each true label
    val: Ragged | None = None  # per-client validation indices (scenario.val_fraction)
    normalization: Normalization = Normalization()  # applied to every input a shard holds
    origin: str = "user"  # where the data come from: SourceData.origin (real, standin, …)
    data_sha256: str = ""  # the pooled samples and labels as loaded (:func:`content_digest`)
    partition_sha256: str = ""  # who holds which sample, in which split

    def digests(self) -> dict[str, str]:
        """What the trials row records of the data: two trials with equal digests trained and
        were scored on the same samples, whatever the specs or the cache paths said."""
        return {"data_sha256": self.data_sha256, "partition_sha256": self.partition_sha256}

    @property
    def has_val(self) -> bool:
        return self.val is not None and len(self.val.flat) > 0

    @property
    def num_clients(self) -> int:
        return len(self.train)

    @cached_property
    def n_train(self) -> np.ndarray:
        """Per-client training sizes, computed once (read every round)."""
        return self.train.lengths

    @cached_property
    def n_test(self) -> np.ndarray:
        return self.test.lengths

    def train_bytes(self) -> int:
        """Size of all clients' training inputs as float32 (what a worker holding them keeps)."""
        return int(self.n_train.sum()) * math.prod(self.input_shape) * 4

    def shard(self, client_ids: np.ndarray, device: torch.device,
              source: SourceData | None = None) -> ShardData:
        source = source or load_source(self.dataset, self.dataset_params)
        return ShardData.build(self, np.asarray(client_ids), source, device)


def build_federation(spec, source: SourceData | None = None) -> Federation:
    """Partition the spec's dataset into ``federation.num_clients`` clients (seeded)."""
    source = source or load_source(spec.dataset.name, spec.dataset_params)
    try:
        check_compatible(spec.scenario.name, spec.dataset.name, source)
    except Incompatible as err:
        raise SpecError([("scenario.name", str(err))]) from None
    num_clients = spec.federation.num_clients
    part = make_partition(spec.scenario.name, spec.scenario_params, source, num_clients,
                          stream(spec.seed, "partition"))
    if part.test is not None:
        train, test = Ragged.from_parts(part.indices), Ragged.from_parts(part.test)
    else:
        train, test = split_train_test(part.indices, spec.scenario_params.test_fraction,
                                       stream(spec.seed, "split"))
    if part.val is not None:
        val = Ragged.from_parts(part.val)
    else:
        totals = train.lengths + test.lengths
        train, val = split_validation(train, totals, spec.scenario_params.val_fraction,
                                      stream(spec.seed, "split", 1))
    splits = [train, test] + ([val] if val is not None else [])
    return Federation(spec.dataset.name, spec.dataset_params, train, test, part.groups,
                      part.angles, source.input_shape, source.num_classes, tuple(source.tasks),
                      part.label_maps, val, input_normalization(spec, source, train),
                      source.origin,
                      content_digest(source.x, source.y, *source.tasks.values()),
                      content_digest(*(a for r in splits for a in (r.flat, r.offsets))))


def content_digest(*arrays) -> str:
    """sha256 of ``arrays``' dtypes, shapes and bytes: equal exactly when the contents are (a
    file digest would miss a different decoding or a stand-in generated anew)."""
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(np.asarray(array))
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


def input_normalization(spec, source: SourceData, train: Ragged) -> Normalization:
    """``dataset.normalize`` for this federation; statistics from its training split only.
    A source whose parameters have no ``normalize`` field is used as it loads."""
    mode = getattr(spec.dataset_params, "normalize", "unit")
    return normalization_for(mode, source, train)


def _rotate(x: torch.Tensor, degrees: float) -> torch.Tensor:
    if degrees % 90 == 0 or not len(x):  # torchvision's rotate refuses an empty batch
        return torch.rot90(x, k=int(degrees // 90) % 4, dims=(-2, -1))
    from torchvision.transforms.functional import rotate

    return rotate(x, degrees)


@dataclass
class ClientData:
    cid: int
    group: int
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    tasks_train: dict[str, torch.Tensor] = field(default_factory=dict)
    tasks_test: dict[str, torch.Tensor] = field(default_factory=dict)
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None
    tasks_val: dict[str, torch.Tensor] = field(default_factory=dict)

    def evaluated_on(self, split: str) -> ClientData:
        """This client with ``split`` (test or val) as its evaluation split (``x_test``…), so
        code that scores ``x_test`` scores whichever split it is given (``raylf.diagnostics``)."""
        if split == "test":
            return self
        return replace(self, x_test=self.x_val, y_test=self.y_val, tasks_test=self.tasks_val)

    @property
    def n_train(self) -> int:
        return len(self.y_train)

    @property
    def n_test(self) -> int:
        return len(self.y_test)


@dataclass
class Split:
    """Concatenated samples of a shard's clients for one split, with per-client offsets."""

    x: torch.Tensor
    y: torch.Tensor
    tasks: dict[str, torch.Tensor]
    offsets: np.ndarray  # len = clients + 1

    def rows(self, position: int) -> slice:
        return slice(int(self.offsets[position]), int(self.offsets[position + 1]))

    @property
    def owner(self) -> torch.Tensor:
        """Position (within the shard) of the client owning each row."""
        counts = torch.as_tensor(np.diff(self.offsets), device=self.y.device)
        return torch.repeat_interleave(torch.arange(len(counts), device=self.y.device), counts)


@dataclass
class ShardData:
    client_ids: np.ndarray
    groups: np.ndarray
    train: Split
    test: Split
    val: Split
    position: dict[int, int]

    @classmethod
    def build(cls, fed: Federation, client_ids: np.ndarray, source: SourceData,
              device: torch.device) -> ShardData:
        def gather(parts: Ragged) -> Split:
            idx, offsets = parts.flat, parts.offsets
            x = torch.from_numpy(source.x[idx]).to(device)
            if fed.angles is not None:
                for pos, cid in enumerate(client_ids):
                    rows = slice(int(offsets[pos]), int(offsets[pos + 1]))
                    x[rows] = _rotate(x[rows], float(fed.angles[cid]))
            fed.normalization.apply(x)
            tasks = {t: torch.from_numpy(source.tasks[t][idx]).to(device) for t in source.tasks}
            y = source.y[idx]
            if fed.label_maps is not None:
                y = fed.label_maps[np.repeat(client_ids, np.diff(offsets)), y]
            return Split(x, torch.from_numpy(y).to(device), tasks, offsets)

        train = gather(fed.train.take(client_ids))
        test = gather(fed.test.take(client_ids))
        val = gather(fed.val.take(client_ids) if fed.val is not None
                     else Ragged.empty(len(client_ids)))
        position = {int(c): p for p, c in enumerate(client_ids)}
        return cls(client_ids, fed.groups[client_ids], train, test, val, position)

    def split(self, name: str) -> Split:
        return {"train": self.train, "test": self.test, "val": self.val}[name]

    def client(self, cid: int) -> ClientData:
        p = self.position[cid]
        tr, te, va = self.train.rows(p), self.test.rows(p), self.val.rows(p)
        return ClientData(
            cid, int(self.groups[p]), self.train.x[tr], self.train.y[tr], self.test.x[te],
            self.test.y[te], {t: v[tr] for t, v in self.train.tasks.items()},
            {t: v[te] for t, v in self.test.tasks.items()}, self.val.x[va], self.val.y[va],
            {t: v[va] for t, v in self.val.tasks.items()},
        )
