"""Dataset sources: each turns its parameters into in-memory arrays for the partitioners.

A source returns every sample it has (train and test pooled): scenarios then give each client a
train and a test split drawn from that client's own distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from raylf.registry import Registry


class SourceParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class SourceData:
    """Pooled samples: ``x`` float32 N×C×H×W (or N×F), ``y`` int64 labels of the main task."""

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    class_names: list[str]
    tasks: dict[str, np.ndarray] = field(default_factory=dict)  # extra task labels, e.g. binary

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])


SOURCES: Registry = Registry("dataset")


@SOURCES.register("digits")
class Digits:
    """scikit-learn's bundled 8×8 handwritten digits (1,797 images): the offline default."""

    class Params(SourceParams):
        pass

    @staticmethod
    def load(params: Params) -> SourceData:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x = (bunch.images / 16.0).astype(np.float32)[:, None, :, :]
        return SourceData(x, bunch.target.astype(np.int64), 10, [str(c) for c in range(10)])


@SOURCES.register("digits_multitask")
class DigitsMultitask:
    """Digits as a two-task dataset, an offline stand-in for the medical data of FMT-SVM.

    Tasks: ``binary`` (digit ≥ 5) and ``multiclass`` (digit mod 3, three classes); the
    multi-class label is the main label that partitioners such as Dirichlet skew.
    """

    class Params(SourceParams):
        pass

    @staticmethod
    def load(params: Params) -> SourceData:
        digits = Digits.load(Digits.Params())
        multiclass = digits.y % 3
        tasks = {"binary": (digits.y >= 5).astype(np.int64), "multiclass": multiclass}
        return SourceData(digits.x, multiclass, 3, ["mod3=0", "mod3=1", "mod3=2"], tasks)


@SOURCES.register("synthetic")
class Synthetic:
    """Gaussian-mixture classification: each class is a blob around its own random mean.

    Sized freely (``n_samples``), so scaling runs with 10,000 clients need no download.
    """

    class Params(SourceParams):
        n_samples: int = Field(20_000, ge=2)
        n_features: int = Field(32, ge=1)
        num_classes: int = Field(10, ge=2)
        separation: float = Field(2.0, gt=0, description="distance scale between class means")
        seed: int = Field(0, ge=0, description="seed of the data itself (not of the partition)")

    @staticmethod
    def load(params: Params) -> SourceData:
        rng = np.random.default_rng(params.seed)
        means = rng.normal(0, params.separation, (params.num_classes, params.n_features))
        y = rng.integers(0, params.num_classes, params.n_samples)
        x = means[y] + rng.normal(0, 1, (params.n_samples, params.n_features))
        names = [f"class{c}" for c in range(params.num_classes)]
        return SourceData(x.astype(np.float32), y.astype(np.int64), params.num_classes, names)


def load_source(name: str, params: BaseModel) -> SourceData:
    return SOURCES.get(name).load(params)
