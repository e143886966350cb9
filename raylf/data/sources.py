"""Dataset sources: each turns its parameters into in-memory arrays for the partitioners.

A source returns every sample it has (train and test pooled): scenarios then give each client a
train and a test split drawn from that client's own distribution. Images come back as float32
N×C×H×W scaled to [0, 1], tables as float32 N×F, text as int64 token ids N×L. What the models
see is set by ``dataset.normalize`` (raylf.data.normalize), applied after the partition because
``standard`` takes its statistics from the training split: images default to ``standard``;
``synthetic`` defaults to ``none`` (its features are generated on a standard scale already, and
``unit`` has no pixel range to refer to); token ids accept only ``none``. A source whose
``Params`` does not derive from ``SourceParams`` is used as it loads.

Every source says where its data come from (``SourceData.origin``, the trials table's
``data_origin``): ``real`` (a download verified against its manifest), ``standin`` (random
content in a real dataset's file format, :mod:`raylf.data.standin`), ``bundled`` (shipped with a
library), ``generated`` (made from a seed) or ``user`` (the user's own file or source code, which
raylf cannot vouch for: the default of a source that does not say).
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from raylf.data import text
from raylf.data.manifest import DatasetError
from raylf.registry import Registry

Normalize = Literal["standard", "unit", "none"]
SPLITS = ("train", "val", "test")  # values of an npz's split array, coded by position


class SourceParams(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # finite numbers only
    normalize: Normalize = Field(
        "standard", description="standard: per-channel mean/std (published constants for "
                                "torchvision's sets, else the pooled training split); unit: "
                                "[0, 1]; none: raw values (0-255 pixels)")


class CachedParams(SourceParams):
    root: str | None = Field(None, description="cache root; default $RAYLF_DATA, else "
                                               "~/.cache/raylf/data")


@dataclass(frozen=True)
class SourceData:
    """Pooled samples: ``x`` float32 N×C×H×W (or N×F, or int64 N×L tokens), ``y`` int64 labels
    of the main task; ``owners`` the natural owner of each sample (a speaking role) if any;
    ``client_of`` / ``split_of`` a partition the data bring along (the ``given`` scenario; split
    coded as positions in ``SPLITS``); ``raw_scale`` the raw value of 1.0 in ``x`` and
    ``published_stats`` the (mean, std) per channel that ``normalize: standard`` uses instead of
    the training split's; ``origin`` where the data come from (see the module docstring)."""

    x: Any
    y: np.ndarray
    num_classes: int
    class_names: list[str]
    tasks: dict[str, np.ndarray] = field(default_factory=dict)  # extra task labels, e.g. binary
    owners: np.ndarray | None = None
    client_of: np.ndarray | None = None
    split_of: np.ndarray | None = None
    raw_scale: float = 1.0
    published_stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    origin: str = "user"

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
                          [str(c) for c in range(10)], raw_scale=16.0, origin="bundled")

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
        return _two_tasks(Digits.load(Digits.Params(size=params.size)))


def _two_tasks(digits: SourceData) -> SourceData:
    """Digit images relabelled as binary (digit ≥ 5) and multiclass (digit mod 3, the main
    label)."""
    multiclass = digits.y % 3
    tasks = {"binary": (digits.y >= 5).astype(np.int64), "multiclass": multiclass}
    return SourceData(digits.x, multiclass, 3, ["mod3=0", "mod3=1", "mod3=2"], tasks,
                      raw_scale=digits.raw_scale, origin=digits.origin)


@SOURCES.register("digits28")
class Digits28:
    """MNIST-sized offline stand-in: the bundled digits, 20×20 in a 28×28 frame, seeded affines.

    Each of scikit-learn's 1,797 digits is drawn 20×20 (bilinear) in the middle of a 28×28
    frame, as MNIST centres its digits, and ``n_samples`` images are made from them in turn,
    each under its own random affine map (rotation ±15°, scale 0.9–1.1, shear ±10°, shift ±2
    px). Every original recurs about n_samples / 1,797 times, so a client's test split can hold
    a transformed copy of one of its training digits, which makes test accuracy somewhat
    optimistic. Deterministic in ``seed`` (the data's own, not the partition's);
    generated in a fraction of a second and kept in memory per process.
    """

    class Params(SourceParams):
        n_samples: int = Field(10_000, ge=10, le=200_000, description="images generated")
        seed: int = Field(0, ge=0, description="seed of the augmentation (not of the partition)")

    @staticmethod
    def load(params: Params) -> SourceData:
        x, y = _augmented_digits(params.n_samples, params.seed)
        return SourceData(x, y, 10, [str(c) for c in range(10)], raw_scale=16.0,
                          origin="generated")


@SOURCES.register("digits28_multitask")
class Digits28Multitask:
    """digits28 with the two tasks of ``digits_multitask``: binary (digit ≥ 5) and multiclass
    (digit mod 3, the main label); FMT-SVM at MNIST size and ~1,600 images per client."""

    class Params(Digits28.Params):
        pass

    @staticmethod
    def load(params: Params) -> SourceData:
        return _two_tasks(Digits28.load(params))


_AFFINE_RANGES = {"degrees": 15.0, "scale": 0.1, "shear_degrees": 10.0, "shift_px": 2.0}


@lru_cache(maxsize=2)
def _augmented_digits(n_samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Digits28's arrays (read-only: every load in this process shares them)."""
    import torch
    import torch.nn.functional as F

    digits = Digits.load(Digits.Params(size=20))
    base = np.arange(n_samples) % len(digits.y)
    framed = np.pad(digits.x, ((0, 0), (0, 0), (4, 4), (4, 4)))[base]
    theta = _inverse_affines(n_samples, framed.shape[-1], np.random.default_rng(seed))
    images = torch.from_numpy(framed)
    grid = F.affine_grid(torch.from_numpy(theta), list(images.shape), align_corners=False)
    x = F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    x = np.ascontiguousarray(x.clamp_(0.0, 1.0).numpy())
    y = digits.y[base]
    x.flags.writeable = y.flags.writeable = False
    return x, y


def _inverse_affines(n: int, side: int, rng: np.random.Generator) -> np.ndarray:
    """n random affine maps about the image centre as grid_sample's n×2×3 matrices, which map
    each output position back to where it samples the input (normalized coordinates, square
    images, so rotation and shear keep their angles)."""
    r = _AFFINE_RANGES
    angle = np.deg2rad(rng.uniform(-r["degrees"], r["degrees"], n))
    scale = rng.uniform(1 - r["scale"], 1 + r["scale"], n)
    shear = np.tan(np.deg2rad(rng.uniform(-r["shear_degrees"], r["shear_degrees"], n)))
    shift = rng.uniform(-r["shift_px"], r["shift_px"], (n, 2, 1)) * 2.0 / side
    cos, sin = np.cos(angle) * scale, np.sin(angle) * scale
    forward = np.stack([np.stack([cos, cos * shear - sin], -1),
                        np.stack([sin, sin * shear + cos], -1)], 1)  # rotation·scale · shear
    inverse = np.linalg.inv(forward)
    return np.concatenate([inverse, -inverse @ shift], axis=2).astype(np.float32)


@SOURCES.register("synthetic")
class Synthetic:
    """Gaussian-mixture classification: each class is a blob around its own random mean.

    Sized freely (``n_samples``), so scaling runs with 10,000 clients need no download. With
    ``clusters: C`` the class means themselves gather around C centres (class c in cluster
    c mod C), so classes of one cluster are similar and a clustering method has structure to find.
    The features are unit-variance noise around the means, so ``normalize`` defaults to ``none``;
    ``standard`` standardizes each feature on the training split.
    """

    class Params(SourceParams):
        normalize: Normalize = Field("none", description="none (default) or standard (per "
                                                         "feature); features have no [0, 1] "
                                                         "pixel scale, so not unit")
        n_samples: int = Field(20_000, ge=2)
        n_features: int = Field(32, ge=1)
        num_classes: int = Field(10, ge=2)
        separation: float = Field(2.0, gt=0, description="distance scale between class means")
        clusters: int = Field(0, ge=0, description="latent groups of class means; 0 = none")
        within: float = Field(0.5, gt=0, description="spread of class means around their "
                                                     "cluster centre, relative to separation")
        seed: int = Field(0, ge=0, description="seed of the data itself (not of the partition)")

        @field_validator("normalize")
        @classmethod
        def _no_pixel_scale(cls, value: str) -> str:
            if value == "unit":
                raise ValueError("synthetic features have no [0, 1] pixel scale to keep; use "
                                 "standard (per feature, on the training split) or none")
            return value

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
        import torch  # its generator draws the noise of 10M samples in a second, numpy's in 13

        noise = torch.Generator().manual_seed(int(rng.integers(2**62)))
        x = torch.randn((params.n_samples, params.n_features), generator=noise).numpy()
        means = means.astype(np.float32)
        for start in range(0, params.n_samples, 1 << 20):  # in chunks: one copy of x at most
            rows = slice(start, start + (1 << 20))
            x[rows] += means[y[rows]]
        names = [f"class{c}" for c in range(params.num_classes)]
        return SourceData(x, y.astype(np.int64), params.num_classes, names, origin="generated")


# ------------------------------------------------------------------------------------------
# torchvision datasets, read from the folder raylf.data.cache guarantees


def _locate(name: str, root: str | None) -> tuple[Path, str]:
    """The dataset's cache folder and its origin (real or standin)."""
    from raylf.data.cache import locate

    return locate(name, root)


def _idx_reader(cls: type) -> type:
    """torchvision's MNIST-family reader pointed at fetch's layout (IDX files directly in the
    dataset folder instead of ``<root>/<Class>/raw``). It reads the IDX files only: torchvision
    would load ``processed/{training,test}.pt`` instead where they exist, files that no
    manifest describes and fetch never verified."""
    return type(cls.__name__, (cls,), {
        "raw_folder": property(lambda self: self.root),
        "_check_legacy_exist": lambda self: False,
    })


# The only globals CIFAR's pickles refer to: numpy's array reconstruction (``numpy.core`` in
# the real archives, written by Python 2; ``numpy._core`` in pickles numpy 2 writes, such as
# the stand-ins'), the array type and its dtype. Anything else would be code run while loading.
CIFAR_GLOBALS = frozenset({("numpy.core.multiarray", "_reconstruct"),
                           ("numpy._core.multiarray", "_reconstruct"),
                           ("numpy", "ndarray"), ("numpy", "dtype")})


class CifarUnpickler(pickle.Unpickler):
    """Loads a CIFAR pickle with nothing callable but :data:`CIFAR_GLOBALS`: even bytes that
    match their digest may be a forgery (a stand-in's marker records its own digests, and anyone
    who can write a shared cache can write a stand-in), so a file that refers to anything else
    is refused before it runs."""

    def find_class(self, module: str, name: str):
        if (module, name) in CIFAR_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it refers to {module}.{name}, which no CIFAR file holds")


def _cifar_file(data: bytes, path: Path, keys: tuple[str, ...], repair: str) -> dict:
    """The mapping a CIFAR pickle holds (:class:`CifarUnpickler`), with ``keys``; a batch's
    ``data`` as N×3072 uint8 rows with a label each. Anything else is an error naming ``path``."""
    try:
        loaded = CifarUnpickler(io.BytesIO(data), encoding="latin1").load()
    except Exception as exc:  # whatever the bytes make the unpickler raise
        problem = f"{type(exc).__name__}: {exc}"
    else:
        problem = _cifar_problem(loaded, keys)
    if problem is not None:
        raise DatasetError(f"{path} is not a CIFAR file ({problem}); it was not loaded. "
                           f"Replace it: {repair}")
    return loaded


def _cifar_problem(loaded: Any, keys: tuple[str, ...]) -> str | None:
    if not isinstance(loaded, dict):
        return f"it holds a {type(loaded).__name__}, not a mapping"
    missing = [k for k in keys if k not in loaded]
    if missing:
        return f"it lacks {', '.join(missing)}"
    if "data" not in keys:
        return None
    rows = loaded["data"]
    if not (isinstance(rows, np.ndarray) and rows.dtype == np.uint8 and rows.ndim == 2
            and rows.shape[1] == 3 * 32 * 32):
        return "its data are not N×3072 uint8 rows"
    labels = loaded[keys[1]]
    if not isinstance(labels, list) or len(labels) != len(rows):
        return f"its {keys[1]} are not a list of {len(rows)} labels"
    return None


def _pickle_reader(cls: type) -> type:
    """torchvision's CIFAR reader that unpickles each file only from bytes that matched the
    digest its manifest publishes (``raylf.data.cache.read_verified``), and then only with the
    globals a CIFAR file needs (:class:`CifarUnpickler`): a pickle runs code as it loads, so a
    damaged, swapped or forged file must never reach an unrestricted unpickler. torchvision's
    own check hashes a file and then opens it again, and its error does not say how to repair
    the cache. ``root`` is the folder the archive unpacked to inside the dataset's cache
    folder; ``download`` is ignored (the cache fetches)."""
    from torchvision.datasets import CIFAR100, VisionDataset

    from raylf.data.cache import read_verified, repair_command

    label = "fine_labels" if issubclass(cls, CIFAR100) else "labels"

    def unpickle(root: Path, filename: str, keys: tuple[str, ...]) -> dict:
        folder, relative = root.parent, f"{root.name}/{cls.base_folder}/{filename}"
        return _cifar_file(read_verified(folder, relative), folder / relative, keys,
                           repair_command(folder.name, folder))

    def __init__(self, root: str, train: bool = True, download: bool = False) -> None:
        VisionDataset.__init__(self, root)
        self.train = train
        batches = [unpickle(Path(root), f, ("data", label))
                   for f, _ in (cls.train_list if train else cls.test_list)]
        self.data = np.vstack([b["data"] for b in batches]).reshape(-1, 3, 32, 32)
        self.data = self.data.transpose(0, 2, 3, 1)  # HWC, as torchvision keeps it
        self.targets = [y for b in batches for y in b[label]]
        meta = cls.meta["key"]
        self.classes = unpickle(Path(root), cls.meta["filename"], (meta,))[meta]
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}

    return type(cls.__name__, (cls,), {"__init__": __init__})


# per-channel mean and std of each official training split on the [0, 1] scale, as published
_PUBLISHED_STATS = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


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

            folder, origin = _locate(name, params.root)
            x, y, classes = _pooled(wrap(getattr(tvd, reader_name)), folder / subfolder)
            return SourceData(x, y, len(classes), [str(c) for c in classes], raw_scale=255.0,
                              published_stats=_PUBLISHED_STATS[name], origin=origin)

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
        normalize: Normalize = Field("none", description="none only: token ids are categories")

        @field_validator("normalize")
        @classmethod
        def _tokens(cls, value: str) -> str:
            if value != "none":
                raise ValueError("shakespeare's inputs are character ids, which are not scaled; "
                                 "remove dataset.normalize (or set none)")
            return value

    @staticmethod
    def load(params: Params) -> SourceData:
        from raylf.data.manifest import load_manifest

        folder, origin = _locate("shakespeare", params.root)
        path = next(iter(sorted(folder.rglob("100.txt"))), None)
        if path is None:
            raise DatasetError(f"no 100.txt below {folder}; fetch shakespeare again (--force)")
        vocab = load_manifest("shakespeare").tasks["next_char"]
        roles = text.parse_roles(path.read_text(encoding="utf-8", errors="replace"))
        corpus = text.Corpus.build(list(roles.values()), vocab, params.seq_len)
        return SourceData(corpus.windows, corpus.targets, len(vocab), vocab,
                          owners=corpus.owners, origin=origin)


@SOURCES.register("npz")
class Npz:
    """Bring your own data: an ``.npz`` with ``x`` (N×H×W, N×H×W×C or N×F; uint8 is scaled by
    1/255, floats are kept) and integer ``y``; each extra ``y_<task>`` array becomes a task.

    Bring your own partition as well: ``client`` (the owning client of each sample, ids
    0..N−1) and optionally ``split`` (``train`` / ``val`` / ``test`` per sample) are used as
    they are by the ``given`` scenario; other scenarios partition the pooled samples and ignore
    them (with a warning). ``standard`` normalizes per channel of images, per feature of N×F.
    """

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
        if len(np.unique(value)) < 2:
            raise ValueError(f"dataset.path: {key} in {where} has one class only "
                             f"({int(value[0])}); a classification task needs at least two")
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise ValueError(f"dataset.path: x in {where} must hold numbers; got {x.dtype}")
    if np.issubdtype(x.dtype, np.floating):
        bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1)
        if bad.any():
            raise ValueError(
                f"dataset.path: x in {where} holds NaN or infinite values in {int(bad.sum())} "
                f"sample(s) (first: index {int(np.argmax(bad))}); remove or impute them before "
                "training: a model cannot learn from them and the run would only diverge")
    if len(x) and (x == x.flat[0]).all():
        raise ValueError(f"dataset.path: x in {where} is one constant value in every sample; "
                         "there is nothing to learn from it")
    client_of, split_of = _given_partition(arrays, len(x), where)
    raw_scale = 255.0 if x.dtype == np.uint8 else 1.0
    x = x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2) if x.ndim == 4 else x
    num_classes = int(y.max()) + 1
    tasks = {k[2:]: v.astype(np.int64) for k, v in labels.items() if k != "y"}
    return SourceData(_unit(x), y.astype(np.int64), num_classes,
                      [str(c) for c in range(num_classes)], tasks, client_of=client_of,
                      split_of=split_of, raw_scale=raw_scale, origin="user")


def _given_partition(arrays: dict[str, np.ndarray], n: int, where: str
                     ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The ``client`` array (int64) and the ``split`` array (int8 positions in ``SPLITS``),
    checked on their own; whether they fit the federation is the ``given`` scenario's check."""
    client, split = arrays.get("client"), arrays.get("split")
    if client is None:
        if split is not None:
            raise ValueError(f"dataset.path: split in {where} comes without a client array; add "
                             "client (the owning client id of each sample) or remove split")
        return None, None
    if client.ndim != 1 or len(client) != n or not np.issubdtype(client.dtype, np.integer):
        raise ValueError(f"dataset.path: client in {where} must be {n} integer client ids (one "
                         f"per sample of x); got {client.dtype} of shape {client.shape}")
    if n and client.min() < 0:
        raise ValueError(f"dataset.path: client in {where} has negative ids; number the clients "
                         "0..N-1")
    if split is None:
        return client.astype(np.int64), None
    if split.ndim != 1 or len(split) != n or split.dtype.kind not in "US":
        raise ValueError(f"dataset.path: split in {where} must be {n} strings (train, val or "
                         f"test, one per sample of x); got {split.dtype} of shape {split.shape}")
    values = split.astype(str)
    unknown = sorted({str(v) for v in np.unique(values)} - set(SPLITS))
    if unknown:
        raise ValueError(f"dataset.path: split in {where} has unknown value(s) {unknown[:5]}; "
                         f"allowed: {', '.join(SPLITS)}")
    codes = np.zeros(n, dtype=np.int8)
    for position, name in enumerate(SPLITS):
        codes[values == name] = position
    return client.astype(np.int64), codes


def _medimeta_source(name: str, doc: str) -> None:
    """Register a MedIMeta dataset (its tasks: ``raylf.data.medimeta.DATASETS``)."""

    class Source:
        class Params(CachedParams):
            size: int = Field(64, ge=8, le=224, description="side of the resized grey image")

        @staticmethod
        def load(params) -> SourceData:
            from raylf.data import medimeta
            from raylf.data.manifest import load_manifest

            folder, origin = _locate(name, params.root)
            x, labels = medimeta.load(folder, medimeta.DATASETS[name][1], params.size)
            classes = list(load_manifest(name).tasks.values())[1]  # the 3-class task
            return SourceData(x, labels["multiclass"], len(classes), classes, labels,
                              raw_scale=255.0, origin=origin)

    Source.__doc__ = doc
    Source.__name__ = Source.__qualname__ = name.title().replace("_", "")
    SOURCES.register(name)(Source)


_medimeta_source("pneumonia", "MedIMeta pediatric pneumonia X-rays: binary normal/pneumonia "
                 "and 3-class normal/bacteria/virus (the main label); grey, resized to 64×64.")
_medimeta_source("breast_ultrasound", "MedIMeta breast ultrasound: binary malignancy and "
                 "3-class normal/benign/malignant (the main label); grey, resized to 64×64.")


def load_source(name: str, params: BaseModel) -> SourceData:
    return SOURCES.get(name).load(params)
