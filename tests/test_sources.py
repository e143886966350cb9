"""Dataset sources against generated fixtures in the exact on-disk layout fetch produces."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from raylf.config import SpecError, validate
from raylf.data import build_federation, text
from raylf.data.cache import MARKER, DatasetMissing, fetch
from raylf.data.manifest import load_manifest
from raylf.data.sources import SOURCES, from_arrays, load_source


def mark_complete(root: Path, name: str) -> Path:
    """Write what a finished fetch leaves: the archives (content unchecked by require), their
    unpack targets and a marker recording the manifest's digests."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest(name)
    for spec in manifest.files:
        (folder / spec.filename).touch()
        if spec.target and not (folder / spec.target).exists():
            (folder / spec.target).mkdir()
    files = [{"filename": f.filename, **f.digests} for f in manifest.files]
    (folder / MARKER).write_text(json.dumps({"version": 1, "name": name, "files": files}))
    return folder


def _idx(array: np.ndarray) -> bytes:
    head = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return head + array.astype(np.uint8).tobytes()


def write_mnist(root: Path, name: str = "mnist", n: tuple[int, int] = (30, 10), seed=0) -> None:
    rng = np.random.default_rng(seed)
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, count in zip(("train", "t10k"), n):
        (folder / f"{prefix}-images-idx3-ubyte").write_bytes(
            _idx(rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)))
        (folder / f"{prefix}-labels-idx1-ubyte").write_bytes(_idx(np.arange(count) % 10))
    mark_complete(root, name)


def write_cifar(root: Path, name: str = "cifar10", per_batch: int = 20, seed=0) -> None:
    """CIFAR python pickles (uint8 N×3072 rows, label lists) in torchvision's file names."""
    rng = np.random.default_rng(seed)
    ten = name == "cifar10"
    classes = 10 if ten else 100
    sub = "cifar-10-python/cifar-10-batches-py" if ten else "cifar-100-python/cifar-100-python"
    folder = root / name / sub
    folder.mkdir(parents=True, exist_ok=True)
    key = "labels" if ten else "fine_labels"
    batches = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"] if ten else \
        ["train", "test"]
    for batch in batches:
        entry = {"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 key: list(rng.integers(0, classes, per_batch))}
        (folder / batch).write_bytes(pickle.dumps(entry))
    meta = {"label_names" if ten else "fine_label_names": [f"c{i}" for i in range(classes)]}
    (folder / ("batches.meta" if ten else "meta")).write_bytes(pickle.dumps(meta))
    mark_complete(root, name)


def trust_unpacked(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Let the cache read the generated files an archive would have unpacked into ``folder``:
    the shipped manifest lists the md5s of the real ones, which a source checks before reading."""
    from raylf.data import cache

    shipped = load_manifest(folder.name)
    files = [spec.model_copy(update={"members": [member.model_copy(update={"md5": hashlib.md5(
        (folder / spec.target / member.path).read_bytes()).hexdigest()}) for member in
        spec.members]}) for spec in shipped.files]
    generated = shipped.model_copy(update={"files": files})
    monkeypatch.setattr(cache, "load_manifest",
                        lambda name: generated if name == folder.name else load_manifest(name))


def test_missing_dataset_says_how_to_fetch(tmp_path: Path) -> None:
    for name in ("mnist", "cifar10", "pneumonia", "shakespeare"):
        params = SOURCES.get(name).Params(root=str(tmp_path))
        with pytest.raises(DatasetMissing, match=f"python -m raylf.datasets fetch {name}"):
            load_source(name, params)


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_idx_sources_read_the_fetch_layout(tmp_path: Path, name: str) -> None:
    write_mnist(tmp_path, name)
    data = load_source(name, SOURCES.get(name).Params(root=str(tmp_path)))
    assert data.x.shape == (40, 1, 28, 28) and data.x.dtype == np.float32
    assert 0 <= data.x.min() and data.x.max() <= 1 and data.x.max() > 0.9
    assert data.y.dtype == np.int64 and data.num_classes == 10 and len(data.class_names) == 10


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_sources_read_the_fetch_layout(tmp_path: Path, name: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    write_cifar(tmp_path, name)
    trust_unpacked(monkeypatch, tmp_path / name)
    data = load_source(name, SOURCES.get(name).Params(root=str(tmp_path)))
    n = 120 if name == "cifar10" else 40
    assert data.x.shape == (n, 3, 32, 32) and data.x.dtype == np.float32
    assert data.x.max() <= 1 and data.num_classes == (10 if name == "cifar10" else 100)


def test_env_var_sets_the_cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_mnist(tmp_path)
    monkeypatch.setenv("RAYLF_DATA", str(tmp_path))
    assert len(load_source("mnist", SOURCES.get("mnist").Params()).y) == 40


def test_npz_source_shapes_scaling_and_tasks(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    x = np.random.default_rng(0).integers(0, 256, (12, 5, 6, 3), dtype=np.uint8)
    np.savez(path, x=x, y=np.arange(12) % 4, y_parity=np.arange(12) % 2)
    data = load_source("npz", SOURCES.get("npz").Params(path=str(path)))
    assert data.x.shape == (12, 3, 5, 6) and np.allclose(data.x[0, :, 1, 2], x[0, 1, 2] / 255)
    assert data.num_classes == 4 and list(data.tasks) == ["parity"]
    assert from_arrays({"x": np.zeros((3, 4, 4), np.float32), "y": np.zeros(3, int)}, "m") \
        .x.shape == (3, 1, 4, 4)


@pytest.mark.parametrize("arrays, match", [
    ({"x": np.zeros((3, 4))}, "lacks array"),
    ({"x": np.zeros(3), "y": np.zeros(3, int)}, "must be N×H×W"),
    ({"x": np.zeros((3, 4)), "y": np.zeros(4, int)}, "y in m must be 3 integer labels"),
    ({"x": np.zeros((3, 4)), "y": np.zeros(3)}, "integer labels"),
    ({"x": np.zeros((3, 4)), "y": np.zeros(3, int), "y_t": np.zeros(2, int)}, "y_t in m"),
])
def test_npz_wrong_shapes_are_clear(arrays: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        from_arrays(arrays, "m")


def test_npz_missing_file_names_the_field(tmp_path: Path) -> None:
    spec = {"dataset": {"name": "npz", "path": str(tmp_path / "nope.npz")},
            "scenario": {"name": "iid"}, "model": {"name": "mlp"}, "method": {"name": "fedavg"},
            "federation": {"num_clients": 2, "rounds": 1}}
    with pytest.raises(SpecError, match=r"dataset\.path: .*no such file"):
        validate(spec)


PLAY = """THE TRAGEDY OF TESTING

by William Shakespeare

ACT I. SCENE I.

  HAMLET. To be, or not to be: that is the question
    whether 'tis nobler in the mind to suffer.
  OPHELIA. Good my lord, how does your honour
    for this many a day? {}

  HAMLET. I humbly thank you; well, well, well.


THE COMEDY OF ERRORS

by William Shakespeare

DROMIO. Methinks you are my glass, and not my brother:
I see by you I am a sweet-faced youth.
"""


def test_shakespeare_roles_follow_leaf_parsing() -> None:
    roles = text.parse_roles(PLAY)
    assert set(roles) == {("THE TRAGEDY OF TESTING", "HAMLET"),
                          ("THE TRAGEDY OF TESTING", "OPHELIA"),
                          ("THE COMEDY OF ERRORS", "DROMIO")}
    hamlet = roles[("THE TRAGEDY OF TESTING", "HAMLET")]
    assert hamlet.startswith("To be, or not to be: that is the question whether")
    assert hamlet.endswith("I humbly thank you; well, well, well.")
    assert "sweet-faced youth" in roles[("THE COMEDY OF ERRORS", "DROMIO")]


def test_shakespeare_windows_stay_inside_a_role() -> None:
    vocab = load_manifest("shakespeare").tasks["next_char"]
    corpus = text.Corpus.build(["abcdefgh", "xy", "0123456"], vocab, 5)
    decode = "".join
    assert corpus.windows.shape == (3 + 0 + 2, 5) and list(corpus.owners) == [0, 0, 0, 2, 2]
    rows = corpus.windows[np.arange(5)]
    assert rows.dtype == np.int64
    assert decode(vocab[i] for i in rows[0]) == "abcde" and vocab[corpus.targets[0]] == "f"
    assert decode(vocab[i] for i in rows[3]) == "01234" and vocab[corpus.targets[4]] == "6"


def test_shakespeare_source_and_natural_scenario(tmp_path: Path) -> None:
    speeches = "\n".join(f"  ROLE{chr(65 + r)}. " + f"line of role {r} " * 30 +
                         "\n" for r in range(8))
    folder = mark_complete(tmp_path, "shakespeare")
    (folder / "1994-01-100" / "100.txt").write_text(PLAY.format("") + "\nA PLAY\n\nby William "
                                                    "Shakespeare\n\n" + speeches)
    spec = validate({"dataset": {"name": "shakespeare", "root": str(tmp_path)},
                     "scenario": {"name": "natural", "roles_per_client": 2, "min_samples": 100},
                     "model": {"name": "mlp"}, "method": {"name": "fedavg"},
                     "federation": {"num_clients": 4, "rounds": 1}})
    source = load_source("shakespeare", spec.dataset.params)
    assert source.input_shape == (50,) and source.num_classes == 80
    fed = build_federation(spec, source)
    roles = [set(source.owners[np.concatenate([fed.train[k], fed.test[k]])]) for k in range(4)]
    assert all(len(r) == 2 for r in roles) and len(set().union(*roles)) == 8
    for k in range(4):  # test windows come after train windows with a 50-window gap per role
        for role in roles[k]:
            tr = fed.train[k][source.owners[fed.train[k]] == role]
            te = fed.test[k][source.owners[fed.test[k]] == role]
            assert te.min() - tr.max() > 50
    shard = fed.shard(np.arange(4), torch.device("cpu"), source)
    assert shard.train.x.dtype == torch.int64 and shard.train.x.shape[1] == 50


def _medimeta_zip(n: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("pneumonia/info.yaml", "id: pneumonia\ntasks:\n  - task_name: pneumonia "
                    "presence\n  - task_name: disease class\n")
        for i in range(n):
            img = io.BytesIO()
            Image.fromarray(np.full((224, 224), i * 20, np.uint8)).save(img, format="TIFF")
            zf.writestr(f"pneumonia/images/{i:06d}.tiff", img.getvalue())
        for task, labels in (("pneumonia presence", np.arange(n) % 2),
                             ("disease class", np.arange(n) % 3)):
            arr = io.BytesIO()
            np.save(arr, labels)
            zf.writestr(f"pneumonia/task_labels/{task}.npy", arr.getvalue())
    return buf.getvalue()


def test_medimeta_source_from_a_fixture_zip(tmp_path: Path) -> None:
    """The layout assumed for the MedIMeta zips (unverified against the real release)."""
    from raylf.data.manifest import Manifest

    (tmp_path / "pneumonia.zip").write_bytes(_medimeta_zip(6))
    shipped = load_manifest("pneumonia").model_dump()
    shipped["files"][0]["url"] = (tmp_path / "pneumonia.zip").as_uri()
    fetch("pneumonia", tmp_path / "cache", Manifest(**shipped), allow_unverified=True)
    data = load_source("pneumonia", SOURCES.get("pneumonia").Params(root=str(tmp_path / "cache")))
    assert data.x.shape == (6, 1, 64, 64) and data.x.dtype == np.float32
    assert np.isclose(data.x[3].mean(), 60 / 255, atol=1e-3)
    assert list(data.y) == [0, 1, 2, 0, 1, 2] and set(data.tasks) == {"binary", "multiclass"}
    assert data.class_names == ["normal", "bacteria", "virus"]


def test_medimeta_missing_task_file_lists_what_is_there(tmp_path: Path) -> None:
    from raylf.data import medimeta
    from raylf.data.manifest import DatasetError

    with zipfile.ZipFile(io.BytesIO(_medimeta_zip(2))) as zf:
        zf.extractall(tmp_path)
    with pytest.raises(DatasetError, match="task 'malignancy'.*pneumonia presence"):
        medimeta.load(tmp_path, {"binary": "malignancy"}, 64)


def test_synthetic_clusters_group_class_means() -> None:
    params = SOURCES.get("synthetic").Params(n_samples=4000, num_classes=6, clusters=2,
                                             within=0.1, n_features=8)
    data = load_source("synthetic", params)
    means = np.stack([data.x[data.y == c].mean(0) for c in range(6)])
    dist = np.linalg.norm(means[:, None] - means[None], axis=-1)
    same = dist[0, 2], dist[1, 3]  # classes c and c+2 share cluster c mod 2
    assert max(same) < min(dist[0, 1], dist[2, 3])


def test_digits28_is_a_seeded_mnist_sized_stand_in() -> None:
    from raylf.data.sources import _augmented_digits

    params = SOURCES.get("digits28").Params
    data = load_source("digits28", params(n_samples=3000))
    assert data.x.shape == (3000, 1, 28, 28) and data.x.dtype == np.float32
    assert 0 <= data.x.min() and data.x.max() <= 1 and data.raw_scale == 16.0
    assert np.bincount(data.y, minlength=10).min() > 250
    fresh = _augmented_digits.__wrapped__(3000, 0)  # regenerated, not the cached arrays
    assert np.array_equal(fresh[0], data.x) and np.array_equal(fresh[1], data.y)
    other = load_source("digits28", params(n_samples=3000, seed=1))
    assert np.array_equal(other.y, data.y) and not np.allclose(other.x, data.x)
    copies = data.x[[0, 1797]]  # one original under two affine maps
    assert not np.allclose(copies[0], copies[1])
    centre, border = data.x[..., 6:22, 6:22].mean(), data.x[..., :2, :].mean()
    assert border < centre / 10  # drawn in the middle of the frame, as MNIST is


def test_digits28_gives_realistic_client_sizes() -> None:
    spec = validate({"dataset": {"name": "digits28"}, "scenario": {"name": "iid",
                                                                   "test_fraction": 0.2},
                     "model": {"name": "cnn"}, "method": {"name": "fedavg"},
                     "federation": {"num_clients": 5, "rounds": 1}})
    fed = build_federation(spec)
    assert list(fed.n_train) == [1600] * 5 and list(fed.n_test) == [400] * 5
