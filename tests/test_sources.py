"""Dataset sources. Reading the downloaded datasets' files is tested on their stand-ins, which
go through the real fetch (tests/test_standin.py); here: what needs no such files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from raylf.config import SpecError, validate
from raylf.data import build_federation, standin, text
from raylf.data.cache import MARKER, DatasetMissing
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


def write_mnist(root: Path, name: str = "mnist") -> Path:
    """MNIST-format data under ``root`` (tests/test_normalize.py reads them): the stand-in."""
    return standin.write(name, root)


def test_missing_dataset_says_how_to_fetch(tmp_path: Path) -> None:
    for name in ("mnist", "cifar10", "pneumonia", "shakespeare"):
        params = SOURCES.get(name).Params(root=str(tmp_path))
        with pytest.raises(DatasetMissing, match=f"python -m raylf.datasets fetch {name}"):
            load_source(name, params)


def test_non_downloaded_sources_say_where_their_data_come_from(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.eye(4, 3, dtype=np.float32), y=np.arange(4) % 2)
    origins = {name: load_source(name, SOURCES.get(name).Params(**params)).origin
               for name, params in [("digits", {}), ("digits_multitask", {}),
                                    ("digits28", {"n_samples": 10}),
                                    ("synthetic", {"n_samples": 10}), ("npz", {"path": str(path)})]}
    assert origins == {"digits": "bundled", "digits_multitask": "bundled",
                       "digits28": "generated", "synthetic": "generated", "npz": "user"}


def test_npz_source_shapes_scaling_and_tasks(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    x = np.random.default_rng(0).integers(0, 256, (12, 5, 6, 3), dtype=np.uint8)
    np.savez(path, x=x, y=np.arange(12) % 4, y_parity=np.arange(12) % 2)
    data = load_source("npz", SOURCES.get("npz").Params(path=str(path)))
    assert data.x.shape == (12, 3, 5, 6) and np.allclose(data.x[0, :, 1, 2], x[0, 1, 2] / 255)
    assert data.num_classes == 4 and list(data.tasks) == ["parity"]
    assert from_arrays({"x": np.arange(48, dtype=np.float32).reshape(3, 4, 4),
                        "y": np.arange(3) % 2}, "m").x.shape == (3, 1, 4, 4)


@pytest.mark.parametrize("arrays, match", [
    ({"x": np.zeros((3, 4))}, "lacks array"),
    ({"x": np.zeros(3), "y": np.zeros(3, int)}, "must be N×H×W"),
    ({"x": np.zeros((3, 4)), "y": np.zeros(4, int)}, "y in m must be 3 integer labels"),
    ({"x": np.zeros((3, 4)), "y": np.zeros(3)}, "integer labels"),
    ({"x": np.zeros((3, 4)), "y": np.arange(3) % 2, "y_t": np.zeros(2, int)}, "y_t in m"),
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
