"""Dataset sources: each turns its parameters into in-memory arrays for the partitioners.

A source returns every sample it has (train and test pooled): scenarios then give each client a
train and a test split drawn from that client's own distribution. Images come back as float32
N×C×H×W scaled to [0, 1] (no mean/std normalization: models and methods see the same inputs
whatever their architecture); text as int64 token ids N×L.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from raylf.data import text
from raylf.registry import Registry


class SourceParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CachedParams(SourceParams):
    root: str | None = Field(None, description="cache root; default $RAYLF_DATA, else "
                                               "~/.cache/raylf/data")


@dataclass(frozen=True)
class SourceData:
    """Pooled samples: ``x`` float32 N×C×H×W (or N×F, or int64 N×L tokens), ``y`` int64 labels
    of the main task; ``owners`` the natural owner of each sample (a speaking role) if any."""

    x: Any
    y: np.ndarray
    num_classes: int
    class_names: list[str]
    tasks: dict[str, np.ndarray] = field(default_factory=dict)  # extra task labels, e.g. binary
    owners: np.ndarray | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])


SOURCES: Registry = Registry("dataset")


def _unit(x: np.ndarray) -> np.ndarray:
    """uint8 pixels to C-contiguous float32 in [0, 1] (one float32 copy, never a float64 one);
    float input is kept as it is."""
    out = x.astype(np.float32, order="C")
    if x.dtype == np.uint8:
        out /= 255.0
    return out


@SOURCES.register("digits")
class Digits:
    """scikit-learn's bundled 8×8 handwritten digits (1,797 images): the offline default.

    ``size`` upsamples them (bilinear) once at load, e.g. 28 for MNIST-shaped inputs, so a CNN
    sized for larger images (its flatten size follows the input) can run offline.
    """

    class Params(SourceParams):
        size: int = Field(8, ge=8, le=224, description="image side in pixels: 8 = native; "
                                                       "e.g. 28 resizes once (bilinear) to "
                                                       "MNIST shape")

    @staticmethod
    def load(params: Params) -> SourceData:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x = (bunch.images / 16.0).astype(np.float32)[:, None, :, :]
        return SourceData(Digits.resize(x, params.size), bunch.target.astype(np.int64), 10,
                          [str(c) for c in range(10)])

    @staticmethod
    def resize(x: np.ndarray, size: int) -> np.ndarray:
        """N×1×8×8 in [0, 1] → N×1×size×size by torch's bilinear interpolation (native: as is).

        Bilinear weights are a convex combination, so values stay in [0, 1] (clamped against
        rounding)."""
        if x.shape[-1] == size:
            return x
        import torch
        import torch.nn.functional as F

        out = F.interpolate(torch.from_numpy(x), size=(size, size), mode="bilinear",
                            align_corners=False)
        return np.ascontiguousarray(out.clamp_(0.0, 1.0).numpy())


@SOURCES.register("digits_multitask")
class DigitsMultitask:
    """Digits as a two-task dataset, an offline stand-in for the medical data of FMT-SVM.

    Tasks: ``binary`` (digit ≥ 5) and ``multiclass`` (digit mod 3, three classes); the
    multi-class label is the main label that partitioners such as Dirichlet skew. ``size`` as
    for ``digits``: 28 gives MNIST-shaped inputs, where the paper's encoder has the scale
    (≈200k parameters) at which FMT-SVM's heads-only upload saving shows.
    """

    class Params(Digits.Params):
        pass

    @staticmethod
    def load(params: Params) -> SourceData:
        digits = Digits.load(Digits.Params(size=params.size))
        multiclass = digits.y % 3
        tasks = {"binary": (digits.y >= 5).astype(np.int64), "multiclass": multiclass}
        return SourceData(digits.x, multiclass, 3, ["mod3=0", "mod3=1", "mod3=2"], tasks)


@SOURCES.register("synthetic")
class Synthetic:
    """Gaussian-mixture classification: each class is a blob around its own random mean.

    Sized freely (``n_samples``), so scaling runs with 10,000 clients need no download. With
    ``clusters: C`` the class means themselves gather around C centres (class c in cluster
    c mod C), so classes of one cluster are similar and a clustering method has structure to find.
    """

    class Params(SourceParams):
        n_samples: int = Field(20_000, ge=2)
        n_features: int = Field(32, ge=1)
        num_classes: int = Field(10, ge=2)
        separation: float = Field(2.0, gt=0, description="distance scale between class means")
        clusters: int = Field(0, ge=0, description="latent groups of class means; 0 = none")
        within: float = Field(0.5, gt=0, description="spread of class means around their "
                                                     "cluster centre, relative to separation")
        seed: int = Field(0, ge=0, description="seed of the data itself (not of the partition)")

    @staticmethod
    def load(params: Params) -> SourceData:
        rng = np.random.default_rng(params.seed)
        shape = (params.num_classes, params.n_features)
        means = rng.normal(0, params.separation, shape)
        if params.clusters:
            centres = means[: params.clusters] if params.clusters <= params.num_classes else \
                rng.normal(0, params.separation, (params.clusters, params.n_features))
            owner = np.arange(params.num_classes) % params.clusters
            means = centres[owner] + rng.normal(0, params.within * params.separation, shape)
        y = rng.integers(0, params.num_classes, params.n_samples)
        x = means[y] + rng.normal(0, 1, (params.n_samples, params.n_features))
        names = [f"class{c}" for c in range(params.num_classes)]
        return SourceData(x.astype(np.float32), y.astype(np.int64), params.num_classes, names)


# ------------------------------------------------------------------------------------------
# torchvision datasets, read from the folder raylf.data.cache guarantees


def _require(name: str, root: str | None) -> Path:
    from raylf.data.cache import require

    return require(name, root)


def _idx_reader(cls: type) -> type:
    """torchvision's MNIST-family reader pointed at fetch's layout (IDX files directly in the
    dataset folder instead of ``<root>/<Class>/raw``)."""
    return type(cls.__name__, (cls,), {
        "raw_folder": property(lambda self: self.root),
        "processed_folder": property(lambda self: os.path.join(self.root, "processed")),
    })


def _pickle_reader(cls: type) -> type:
    """torchvision's CIFAR reader without its per-file md5 check: fetch verified the archive's
    md5 when it was downloaded, and re-hashing 180 MB on every worker load buys nothing."""
    return type(cls.__name__, (cls,), {
        "train_list": [[f, None] for f, _ in cls.train_list],
        "test_list": [[f, None] for f, _ in cls.test_list],
        "meta": {**cls.meta, "md5": None},
    })


def _pooled(reader: type, root: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    parts = [reader(str(root), train=train, download=False) for train in (True, False)]
    x = np.concatenate([np.asarray(p.data) for p in parts])
    y = np.concatenate([np.asarray(p.targets) for p in parts]).astype(np.int64)
    x = x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)  # grey N×H×W / colour N×H×W×C
    return _unit(x), y, list(parts[0].classes)


def _torchvision_source(name: str, reader_name: str, wrap, subfolder: str, doc: str) -> None:
    class Source:
        class Params(CachedParams):
            pass

        @staticmethod
        def load(params: CachedParams) -> SourceData:
            import torchvision.datasets as tvd

            folder = _require(name, params.root) / subfolder
            x, y, classes = _pooled(wrap(getattr(tvd, reader_name)), folder)
            return SourceData(x, y, len(classes), [str(c) for c in classes])

    Source.__doc__ = doc
    Source.__name__ = Source.__qualname__ = reader_name
    SOURCES.register(name)(Source)


_torchvision_source("mnist", "MNIST", _idx_reader, "",
                    "MNIST (70,000 grey 28×28 digits) via torchvision, from the fetch cache.")
_torchvision_source("fashion_mnist", "FashionMNIST", _idx_reader, "",
                    "Fashion-MNIST (70,000 grey 28×28 articles) via torchvision.")
_torchvision_source("cifar10", "CIFAR10", _pickle_reader, "cifar-10-python",
                    "CIFAR-10 (60,000 colour 32×32 images, 10 classes) via torchvision.")
_torchvision_source("cifar100", "CIFAR100", _pickle_reader, "cifar-100-python",
                    "CIFAR-100 (60,000 colour 32×32 images, 100 fine classes) via torchvision.")


# ------------------------------------------------------------------------------------------
# text and medical images


@SOURCES.register("shakespeare")
class Shakespeare:
    """LEAF Shakespeare: next-character prediction, one natural owner per (play, speaking role).

    A sample is a ``seq_len``-character window of one role's dialogue (int64 ids in LEAF's
    80-character vocabulary) and its label the character that follows; ``owners`` holds the
    role, which the ``natural`` scenario groups into clients.
    """

    class Params(CachedParams):
        seq_len: int = Field(50, ge=1, description="characters per sample (SP-CACW: 50)")

    @staticmethod
    def load(params: Params) -> SourceData:
        from raylf.data.manifest import load_manifest

        folder = _require("shakespeare", params.root)
        path = next(iter(sorted(folder.rglob("100.txt"))), None)
        if path is None:
            from raylf.data.manifest import DatasetError

            raise DatasetError(f"no 100.txt below {folder}; fetch shakespeare again (--force)")
        vocab = load_manifest("shakespeare").tasks["next_char"]
        roles = text.parse_roles(path.read_text(encoding="utf-8", errors="replace"))
        corpus = text.Corpus.build(list(roles.values()), vocab, params.seq_len)
        return SourceData(corpus.windows, corpus.targets, len(vocab), vocab,
                          owners=corpus.owners)


@SOURCES.register("npz")
class Npz:
    """Bring your own data: an ``.npz`` with ``x`` (N×H×W, N×H×W×C or N×F; uint8 is scaled by
    1/255, floats are kept) and integer ``y``; each extra ``y_<task>`` array becomes a task."""

    class Params(SourceParams):
        path: str = Field(description="the .npz file")

        @field_validator("path")
        @classmethod
        def _exists(cls, value: str) -> str:
            if not Path(value).expanduser().is_file():
                raise ValueError(f"no such file: {value}")
            return value

    @staticmethod
    def load(params: Params) -> SourceData:
        with np.load(Path(params.path).expanduser(), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        return from_arrays(arrays, params.path)


def from_arrays(arrays: dict[str, np.ndarray], where: str) -> SourceData:
    """Check and convert user arrays; every error names the file and the array."""
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise ValueError(f"dataset.path: {where} lacks array(s) {missing}; has {sorted(arrays)}")
    x, y = arrays["x"], arrays["y"]
    if x.ndim not in (2, 3, 4):
        raise ValueError(f"dataset.path: x in {where} must be N×H×W, N×H×W×C or N×F; got shape "
                         f"{x.shape}")
    labels = {"y": y, **{k: v for k, v in arrays.items() if k.startswith("y_")}}
    for key, value in labels.items():
        if value.ndim != 1 or len(value) != len(x) or not np.issubdtype(value.dtype, np.integer):
            raise ValueError(f"dataset.path: {key} in {where} must be {len(x)} integer labels; "
                             f"got {value.dtype} of shape {value.shape}")
        if value.min() < 0:
            raise ValueError(f"dataset.path: {key} in {where} has negative labels")
    x = x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2) if x.ndim == 4 else x
    num_classes = int(y.max()) + 1
    tasks = {k[2:]: v.astype(np.int64) for k, v in labels.items() if k != "y"}
    return SourceData(_unit(x), y.astype(np.int64), num_classes,
                      [str(c) for c in range(num_classes)], tasks)


def _medimeta_source(name: str, tasks: dict[str, str], doc: str) -> None:
    """Register a MedIMeta dataset; ``tasks`` maps raylf's task keys (``binary``,
    ``multiclass``: the keys FMT-SVM reads) to MedIMeta's task names."""

    class Source:
        class Params(CachedParams):
            size: int = Field(64, ge=8, le=224, description="side of the resized grey image")

        @staticmethod
        def load(params) -> SourceData:
            from raylf.data import medimeta
            from raylf.data.manifest import load_manifest

            x, labels = medimeta.load(_require(name, params.root), tasks, params.size)
            classes = list(load_manifest(name).tasks.values())[1]  # the 3-class task
            return SourceData(x, labels["multiclass"], len(classes), classes, labels)

    Source.__doc__ = doc
    Source.__name__ = Source.__qualname__ = name.title().replace("_", "")
    SOURCES.register(name)(Source)


_medimeta_source("pneumonia", {"binary": "pneumonia presence", "multiclass": "disease class"},
                 "MedIMeta pediatric pneumonia X-rays: binary normal/pneumonia and 3-class "
                 "normal/bacteria/virus (the main label); grey, resized to 64×64.")
_medimeta_source("breast_ultrasound", {"binary": "malignancy", "multiclass": "case category"},
                 "MedIMeta breast ultrasound: binary malignancy and 3-class normal/benign/"
                 "malignant (the main label); grey, resized to 64×64.")


def load_source(name: str, params: BaseModel) -> SourceData:
    return SOURCES.get(name).load(params)
