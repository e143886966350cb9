"""dataset.normalize: what the models see, where its statistics come from, what is recorded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from raylf import results
from raylf.config import SpecError, validate
from raylf.data import build_federation
from raylf.data.normalize import channel_stats
from raylf.data.sources import SOURCES, load_source
from raylf.experiment import run_experiment
from tests.conftest import small_spec_dict
from tests.test_sources import write_mnist


def _npz(tmp_path: Path, **arrays) -> str:
    path = tmp_path / "data.npz"
    np.savez(path, **arrays)
    return str(path)


def _spec(dataset: dict, scenario: dict | None = None, clients: int = 4):
    return validate({"dataset": dataset, "scenario": scenario or {"name": "iid"},
                     "model": {"name": "mlp"}, "method": {"name": "fedavg"},
                     "federation": {"num_clients": clients, "rounds": 1}})


def _train_inputs(fed) -> torch.Tensor:
    return fed.shard(np.arange(fed.num_clients), torch.device("cpu")).train.x


def test_standard_takes_its_statistics_from_the_training_split_only(tmp_path: Path) -> None:
    """Test and validation samples are far brighter than training ones: had they leaked into
    the statistics, the mean would move towards 100."""
    rng = np.random.default_rng(0)
    n = 120
    split = np.array(["train", "val", "test"])[np.arange(n) % 3]
    x = np.where(split[:, None] == "train", rng.normal(0.5, 0.1, (n, 6)), 100.0)
    path = _npz(tmp_path, x=x.astype(np.float32), y=np.arange(n) % 3, client=np.arange(n) % 4,
                split=split)
    fed = build_federation(_spec({"name": "npz", "path": path}, {"name": "given"}))
    train_rows = np.concatenate(fed.train)
    assert set(split[train_rows]) == {"train"}
    norm = fed.normalization
    assert norm.mode == "standard" and norm.origin == "training split"
    assert np.allclose(norm.mean, x[train_rows].mean(0)) and np.allclose(norm.std,
                                                                           x[train_rows].std(0))
    pooled = _train_inputs(fed)
    assert torch.allclose(pooled.mean(0), torch.zeros(6), atol=1e-5)
    assert torch.allclose(pooled.std(0, unbiased=False), torch.ones(6), atol=1e-4)


def test_standard_is_per_channel_of_images(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (60, 5, 5, 3), dtype=np.uint8)
    x[..., 1] //= 4  # channels with different means and spreads
    fed = build_federation(_spec({"name": "npz", "path": _npz(tmp_path, x=x, y=np.arange(60) % 2)}))
    pooled = _train_inputs(fed)  # N×C×H×W
    per_channel = pooled.transpose(0, 1).reshape(3, -1)
    assert torch.allclose(per_channel.mean(1), torch.zeros(3), atol=1e-5)
    assert torch.allclose(per_channel.std(1, unbiased=False), torch.ones(3), atol=1e-4)
    assert fed.normalization.mean[1] < fed.normalization.mean[0] / 2


def test_unit_and_none_scale_pixels(tmp_path: Path) -> None:
    x = np.random.default_rng(2).integers(0, 256, (40, 4, 4), dtype=np.uint8)
    path = _npz(tmp_path, x=x, y=np.arange(40) % 2)
    for mode, scale in (("unit", 1 / 255), ("none", 1.0)):
        fed = build_federation(_spec({"name": "npz", "path": path, "normalize": mode}))
        rows = np.concatenate(fed.train)
        expect = torch.from_numpy(x[rows][:, None].astype(np.float32) * np.float32(scale))
        assert torch.allclose(_train_inputs(fed), expect, atol=1e-4)
        assert fed.normalization.mean is None and fed.normalization.columns()["normalize_mean"] \
            is None


def test_torchvision_sets_use_the_published_constants(tmp_path: Path) -> None:
    write_mnist(tmp_path)
    fed = build_federation(_spec({"name": "mnist", "root": str(tmp_path)}))
    assert fed.normalization.origin == "published constants"
    assert fed.normalization.mean == (0.1307,) and fed.normalization.std == (0.3081,)
    source = load_source("mnist", SOURCES.get("mnist").Params(root=str(tmp_path)))
    rows = np.concatenate(fed.train)
    expect = (torch.from_numpy(source.x[rows]) - 0.1307) / 0.3081
    assert torch.allclose(_train_inputs(fed), expect, atol=1e-5)


def test_channel_stats_match_numpy_in_chunks() -> None:
    x = np.random.default_rng(3).normal(1e3, 2.0, (50, 2, 3, 3)).astype(np.float32)
    rows = np.arange(0, 50, 2)
    mean, std = channel_stats(x, rows)
    assert np.allclose(mean, x[rows].mean((0, 2, 3), dtype=np.float64))
    assert np.allclose(std, x[rows].astype(np.float64).std((0, 2, 3)), rtol=1e-6)
    constant = np.ones((10, 1, 2, 2), np.float32)
    assert channel_stats(constant, np.arange(10)) == ((1.0,), (1.0,))  # centred, not ÷ 0


def test_rotation_is_applied_before_normalization() -> None:
    """Rotating a standardized image by 45° fills corners with 0 = the mean; rotating first (as
    an image is rotated before it is normalized) fills them with black, -mean/std."""
    fed = build_federation(_spec({"name": "digits"}, {"name": "rotation", "step": 45.0}))
    shard = fed.shard(np.array([1]), torch.device("cpu"))
    mean, std = fed.normalization.mean[0], fed.normalization.std[0]
    corner = shard.train.x[:, 0, 0, 0]
    assert torch.allclose(corner, torch.full_like(corner, -mean / std), atol=1e-5)


@pytest.mark.parametrize("dataset, field, message", [
    ({"name": "synthetic", "normalize": "unit"}, "dataset.normalize", "no [0, 1] pixel scale"),
    ({"name": "shakespeare", "normalize": "standard"}, "dataset.normalize", "character ids"),
    ({"name": "digits", "normalize": "zscore"}, "dataset.normalize",
     "'standard', 'unit' or 'none'"),
])
def test_normalize_that_does_not_apply_is_refused(dataset, field, message) -> None:
    with pytest.raises(SpecError, match=rf"{re.escape(field)}: .*{re.escape(message)}"):
        _spec(dataset)


def test_defaults_per_kind_of_input() -> None:
    assert _spec({"name": "digits"}).dataset_params.normalize == "standard"
    assert _spec({"name": "digits28", "n_samples": 100}).dataset_params.normalize == "standard"
    assert _spec({"name": "synthetic"}).dataset_params.normalize == "none"
    assert _spec({"name": "shakespeare"}).dataset_params.normalize == "none"
    fed = build_federation(_spec({"name": "synthetic", "n_samples": 400}))
    assert fed.normalization.mode == "none" and fed.normalization.mean is None


def test_trials_table_records_what_was_applied(tmp_path: Path) -> None:
    spec = validate(small_spec_dict(federation__rounds=1, eval_every=1))
    run_experiment(spec, backend="local", out=str(tmp_path))
    trial = results.load(tmp_path)["trials"].iloc[0]
    fed = build_federation(spec)
    assert trial["normalize"] == "standard"  # the default in effect, not written in the spec
    assert trial["normalize_from"] == "training split"
    assert json.loads(trial["normalize_mean"]) == pytest.approx(list(fed.normalization.mean))
    assert json.loads(trial["normalize_std"]) == pytest.approx(list(fed.normalization.std))


def test_benchmark_floor_sees_the_same_inputs() -> None:
    """The hand-written floor loop reproduces raylf's per-client accuracies only if it applies
    the same normalization; under unit inputs the accuracies differ, so the check can fail."""
    from benchmarks import workloads as W

    base = W.with_fields(W.TINY, federation__rounds=2, eval_every=2)
    ours = {}
    for mode in ("standard", "unit"):
        spec = W.make_spec(base, dataset__normalize=mode, cohort="off")
        floor = W.floor_run(spec)["final_acc_per_client"]
        clients = run_experiment(spec, backend="local", reraise=True).tables["clients"]
        ours[mode] = [r["accuracy"] for r in sorted(clients, key=lambda r: r["client_id"])]
        assert ours[mode] == floor
    assert ours["standard"] != ours["unit"]


def test_describe_prints_the_normalization(capsys: pytest.CaptureFixture) -> None:
    from raylf.datasets import main

    spec = Path(__file__).resolve().parents[1] / "tune/examples/digits28_rotation.yaml"
    assert main(["describe", "--spec", str(spec)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("inputs: normalize standard (training split): mean [0.")
