"""The ``given`` scenario: a partition the data bring (an npz's client and split arrays)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from raylf.config import SpecError, validate
from raylf.data import build_federation
from raylf.data.sources import SOURCES, load_source
from raylf.experiment import run_experiment


def _npz(tmp_path: Path, n: int = 90, clients: int = 3, name: str = "given", **arrays) -> str:
    """x, y and a shuffled client array over ``clients`` ids; an array given as None is left out."""
    rng = np.random.default_rng(0)
    path = tmp_path / f"{name}.npz"
    base = {"x": rng.normal(size=(n, 5)).astype(np.float32), "y": np.arange(n) % 3,
            "client": rng.permutation(np.arange(n) % clients)}
    np.savez(path, **{k: v for k, v in {**base, **arrays}.items() if v is not None})
    return str(path)


def _spec(path: str, clients: int = 3, **scenario):
    return validate({"dataset": {"name": "npz", "path": path},
                     "scenario": {"name": "given", **scenario}, "model": {"name": "mlp"},
                     "method": {"name": "fedavg"},
                     "federation": {"num_clients": clients, "rounds": 1}})


def _arrays(path: str) -> dict[str, np.ndarray]:
    with np.load(path) as npz:
        return {k: npz[k] for k in npz.files}


def test_without_split_each_client_holds_exactly_its_samples(tmp_path: Path) -> None:
    path = _npz(tmp_path)
    client = _arrays(path)["client"]
    fed = build_federation(_spec(path, test_fraction=0.2))
    for k in range(3):
        mine = np.flatnonzero(client == k)
        assert np.array_equal(np.sort(np.concatenate([fed.train[k], fed.test[k]])), mine)
        assert len(fed.test[k]) == round(0.2 * len(mine))
    assert list(fed.groups) == [0, 1, 2] and not fed.has_val


def test_split_array_is_used_as_given(tmp_path: Path) -> None:
    split = np.array(["train", "train", "val", "test", "train", "test"] * 15)
    path = _npz(tmp_path, split=split)
    client = _arrays(path)["client"]
    fed = build_federation(_spec(path))
    assert fed.has_val
    for k in range(3):
        for name, rows in (("train", fed.train[k]), ("val", fed.val[k]), ("test", fed.test[k])):
            assert np.array_equal(rows, np.flatnonzero((client == k) & (split == name)))


def test_a_run_scores_every_client_on_its_given_test_samples(tmp_path: Path) -> None:
    split = np.where(np.arange(90) % 4 == 0, "test", "train")
    path = _npz(tmp_path, split=split.astype("S5"))  # bytes strings read like str
    client = _arrays(path)["client"]
    clients = run_experiment(_spec(path), backend="local", reraise=True).tables["clients"]
    scored = {r["client_id"]: r["n_test"] for r in clients}
    assert scored == {k: int(((client == k) & (split == "test")).sum()) for k in range(3)}


def test_npz_partition_arrays_are_parsed(tmp_path: Path) -> None:
    path = _npz(tmp_path, split=np.array(["test", "val", "train"] * 30))
    data = load_source("npz", SOURCES.get("npz").Params(path=path))
    assert data.client_of.dtype == np.int64 and list(data.split_of[:3]) == [2, 1, 0]
    plain = load_source("npz", SOURCES.get("npz").Params(path=_npz(tmp_path, name="plain",
                                                                   client=None)))
    assert plain.client_of is None and plain.split_of is None


def test_another_scenario_ignores_the_client_array_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _npz(tmp_path)
    spec = validate({"dataset": {"name": "npz", "path": path}, "scenario": {"name": "iid"},
                     "model": {"name": "mlp"}, "method": {"name": "fedavg"},
                     "federation": {"num_clients": 5, "rounds": 1}})
    with caplog.at_level(logging.WARNING, logger="raylf.data.scenarios"):
        fed = build_federation(spec)
    assert fed.num_clients == 5
    assert "brings its own partition" in caplog.text and "scenario given" in caplog.text


def test_fractions_do_not_apply_when_the_split_is_given(tmp_path: Path) -> None:
    path = _npz(tmp_path, split=np.array(["train", "test"] * 45))
    with pytest.raises(SpecError, match=r"scenario\.val_fraction: .*split array fixes"):
        build_federation(_spec(path, val_fraction=0.1))
