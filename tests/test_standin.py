"""Format-true stand-ins (raylf.data.standin): through the real fetch, verify and load path,
recorded and announced as stand-ins, never confused with real data."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from raylf import results
from raylf.config import validate
from raylf.data import build_federation, medimeta, presets, standin
from raylf.data.cache import MARKER, DatasetMissing, dataset_origin, fetch, require, verify
from raylf.data.manifest import DatasetError, load_manifest, manifest_names
from raylf.data.sources import SOURCES, load_source
from raylf.datasets import main as datasets_main
from raylf.datasets import resolve
from raylf.run import main as run_main
from tests.conftest import small_spec_dict
from tests.test_sources import PLAY, mark_complete


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every dataset's stand-in, written once into one root (never modified by a test)."""
    base = tmp_path_factory.mktemp("standins")
    for name in manifest_names():
        standin.write(name, base)
    return base


def _load(name: str, root: Path):
    return load_source(name, SOURCES.get(name).Params(root=str(root)))


def _marker(folder: Path) -> dict:
    return json.loads((folder / MARKER).read_text())


IMAGES = {  # name: (x shape, classes)
    "mnist": ((1200, 1, 28, 28), 10), "fashion_mnist": ((1200, 1, 28, 28), 10),
    "cifar10": ((1200, 3, 32, 32), 10), "cifar100": ((1200, 3, 32, 32), 100),
    "pneumonia": ((90, 1, 64, 64), 3), "breast_ultrasound": ((90, 1, 64, 64), 3),
}


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_image_standins_load_like_the_real_files(root: Path, name: str) -> None:
    shape, classes = IMAGES[name]
    data = _load(name, root)
    assert data.x.shape == shape and data.x.dtype == np.float32 and data.y.dtype == np.int64
    assert 0 <= data.x.min() and data.x.max() <= 1 and data.x.std() > 0.1
    assert data.num_classes == classes == len(data.class_names)
    if name.startswith("cifar"):  # read from the archive's meta pickle
        assert data.class_names == list(load_manifest(name).tasks.values())[0]
    assert np.bincount(data.y, minlength=classes).tolist() == [len(data.y) // classes] * classes
    assert data.origin == "standin"
    # one random prototype per class: images of a class resemble each other more than others
    first, second = (data.x[data.y == c].reshape((data.y == c).sum(), -1) for c in (0, 1))
    assert np.abs(first - first.mean(0)).mean() < np.abs(first - second.mean(0)).mean()
    folder = root / name
    marker = _marker(folder)
    assert marker["origin"] == "standin" and marker["standin"]["seed"] == 0
    for spec in load_manifest(name).files:  # the real file names, kept and unpacked
        assert (folder / spec.filename).is_file() and (folder / spec.target).exists()
    assert dataset_origin(name, root) == "standin" and verify(name, root) == folder


@pytest.mark.parametrize("name, positive", [("pneumonia", [1, 2]),
                                            ("breast_ultrasound", [2])])
def test_medimeta_standin_tasks_agree_as_the_real_ones_do(root: Path, name: str,
                                                          positive: list[int]) -> None:
    data = _load(name, root)
    assert set(data.tasks) == {"binary", "multiclass"}
    assert np.array_equal(data.tasks["binary"], np.isin(data.y, positive))
    dataset_id, tasks = medimeta.DATASETS[name]
    base = root / name / load_manifest(name).files[0].target / dataset_id
    info = yaml.safe_load((base / "info.yaml").read_text())
    assert [t["task_name"] for t in info["tasks"]] == [tasks["binary"], tasks["multiclass"]]
    splits = [np.loadtxt(base / "splits" / f"{s}.txt", dtype=int) for s in ("train", "val",
                                                                           "test")]
    assert sorted(np.concatenate(splits).tolist()) == list(range(len(data.y)))


def test_medimeta_missing_task_file_lists_what_is_there(root: Path) -> None:
    with pytest.raises(DatasetError, match="task 'malignancy'.*pneumonia presence"):
        medimeta.load(root / "pneumonia", {"binary": "malignancy"}, 64)


def test_shakespeare_standin_parses_into_roles_for_the_natural_scenario(root: Path) -> None:
    spec = validate({"dataset": {"name": "shakespeare", "root": str(root)},
                     "scenario": {"name": "natural", "roles_per_client": 2, "min_samples": 100},
                     "model": {"name": "mlp"}, "method": {"name": "fedavg"},
                     "federation": {"num_clients": 4, "rounds": 1}})
    source = load_source("shakespeare", spec.dataset_params)
    assert source.input_shape == (50,) and source.num_classes == 80
    assert source.origin == "standin" and len(np.unique(source.owners)) == 154
    text = (root / "shakespeare" / "1994-01-100" / "100.txt").read_text()
    assert text.startswith("raylf STAND-IN") and "THE SONNETS" in text
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


def test_every_paper_preset_builds_its_federation_on_the_standins(root: Path) -> None:
    sources = {}
    for name in presets.names():
        spec = resolve(name, None, str(root), None)
        key = (spec.dataset.name, json.dumps(spec.dataset_params.model_dump()))
        if key not in sources:
            sources[key] = load_source(spec.dataset.name, spec.dataset_params)
        fed = build_federation(spec, sources[key])
        assert fed.origin == "standin", name
        assert fed.num_clients == presets.PRESETS[name]["federation"]["num_clients"], name
        assert fed.n_train.min() >= 1 and fed.n_test.min() >= 1, name


def test_env_var_sets_the_cache_root(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYLF_DATA", str(root))
    assert len(load_source("mnist", SOURCES.get("mnist").Params()).y) == 1200


def test_one_seed_gives_the_same_files(tmp_path: Path) -> None:
    def archive_digests(base: Path, seed: int) -> list[str]:
        return [f["sha256"] for f in _marker(standin.write("mnist", base, seed=seed))["files"]]

    same = archive_digests(tmp_path / "a", 0)
    assert archive_digests(tmp_path / "b", 0) == same
    assert set(archive_digests(tmp_path / "c", 1)).isdisjoint(same)


class _Canary:
    """Unpickling this creates a folder: proof that a pickle was loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        import os

        return os.mkdir, (str(self.path),)


def test_tampered_standin_cifar_batch_is_never_unpickled(root: Path, tmp_path: Path) -> None:
    base = tmp_path / "standins"
    folder = shutil.copytree(root / "cifar10", base / "cifar10")
    before = _load("cifar10", base)
    batch = folder / "cifar-10-python" / "cifar-10-batches-py" / "data_batch_3"
    recorded = next(m["sha256"] for m in _marker(folder)["files"][0]["members"]
                    if m["path"].endswith("data_batch_3"))
    assert hashlib.sha256(batch.read_bytes()).hexdigest() == recorded
    canary = tmp_path / "unpickled"
    batch.write_bytes(pickle.dumps(_Canary(canary)))
    repair = f"python -m raylf.datasets standin cifar10 --root {base}"
    with pytest.raises(DatasetError, match=f"expected sha256 {recorded}") as err:
        _load("cifar10", base)
    assert not canary.exists() and repair in str(err.value)
    with pytest.raises(DatasetError, match="checksum mismatch"):
        verify("cifar10", base)
    standin.write("cifar10", base)  # the repair the message names
    assert np.array_equal(_load("cifar10", base).x, before.x) and not canary.exists()


def test_a_forged_standin_cifar_batch_runs_no_code_and_is_refused_naming_the_file(
        root: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A stand-in's marker records its own digests, so whoever can write a cache (a shared
    RAYLF_DATA, a copied cache) can forge one whose batch hashes as recorded: a pickle that
    runs code as it loads. It is refused before anything starts, naming the file, and runs
    nothing."""
    from tests.test_bad_input import assert_refused

    base = tmp_path / "standins"
    folder = shutil.copytree(root / "cifar10", base / "cifar10")
    batch = folder / "cifar-10-python" / "cifar-10-batches-py" / "data_batch_3"
    canary = tmp_path / "unpickled"
    forged = pickle.dumps(_Canary(canary))
    batch.write_bytes(forged)
    marker = _marker(folder)
    for member in marker["files"][0]["members"]:
        if member["path"].endswith("data_batch_3"):
            member["sha256"] = hashlib.sha256(forged).hexdigest()
    (folder / MARKER).write_text(json.dumps(marker))
    assert verify("cifar10", base) == folder  # every digest as its marker records
    spec = small_spec_dict(dataset={"name": "cifar10", "root": str(base)},
                           model={"name": "mlp", "hidden": [8]})
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    code = run_main([str(tmp_path / "spec.yaml"), "--out", str(tmp_path / "out"),
                     "--backend", "local"])
    err = capsys.readouterr().err
    assert_refused(code, err, "dataset.name", f"{batch} is not a CIFAR file", tmp_path / "out")
    assert "mkdir, which no CIFAR file holds" in err
    assert f"python -m raylf.datasets standin cifar10 --root {base}" in err
    assert not canary.exists()


def test_mnist_reads_its_verified_idx_files_never_torchvisions_processed_ones(
        root: Path, tmp_path: Path) -> None:
    """torchvision's MNIST loads ``processed/{training,test}.pt`` instead of the IDX files where
    they exist: files no manifest describes and no fetch verified."""
    base = tmp_path / "standins"
    folder = shutil.copytree(root / "mnist", base / "mnist")
    before = _load("mnist", base)
    (folder / "processed").mkdir()
    for name in ("training.pt", "test.pt"):
        torch.save((torch.zeros(5, 28, 28, dtype=torch.uint8), torch.zeros(5, dtype=torch.int64)),
                   folder / "processed" / name)
    after = _load("mnist", base)
    assert np.array_equal(after.x, before.x) and np.array_equal(after.y, before.y)
    assert after.x.shape == IMAGES["mnist"][0]


def test_a_standin_is_never_written_over_real_data(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    real = mark_complete(tmp_path, "mnist")
    marker = (real / MARKER).read_bytes()
    with pytest.raises(standin.StandinRefused, match="holds the real dataset"):
        standin.write("mnist", tmp_path)
    assert (real / MARKER).read_bytes() == marker and dataset_origin("mnist", tmp_path) == "real"
    assert datasets_main(["standin", "mnist", "--root", str(tmp_path)]) == 2
    assert "holds the real dataset" in capsys.readouterr().err
    placed = tmp_path / "cifar10"  # a file placed by hand for fetch to verify
    placed.mkdir()
    (placed / "cifar-10-python.tar.gz").write_bytes(b"the real archive, say")
    with pytest.raises(standin.StandinRefused, match="files that are not a stand-in's"):
        standin.write("cifar10", tmp_path)
    assert (placed / "cifar-10-python.tar.gz").read_bytes() == b"the real archive, say"


def test_a_real_fetch_replaces_a_standin_and_reuses_none_of_its_files(tmp_path: Path) -> None:
    """Shakespeare's archive has no published digest: a fetch reuses a file already in place
    as it is, so the stand-in's own archive must be gone before the real one is fetched."""
    standin.write("shakespeare", tmp_path)
    server = tmp_path / "server"
    server.mkdir()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("100.txt", PLAY.format(""))
    (server / "1994-01-100.zip").write_bytes(buf.getvalue())
    shipped = load_manifest("shakespeare")
    real = shipped.model_copy(update={"files": [shipped.files[0].model_copy(update={
        "url": (server / "1994-01-100.zip").as_uri(), "mirrors": []})]})
    folder = fetch("shakespeare", tmp_path, real, allow_unverified=True)
    assert (folder / "1994-01-100.zip").read_bytes() == buf.getvalue()
    assert (folder / "1994-01-100" / "100.txt").read_text() == PLAY.format("")
    assert _marker(folder)["origin"] == "real" and "standin" not in _marker(folder)
    assert dataset_origin("shakespeare", tmp_path, real) == "real"
    assert sorted(p.name for p in folder.iterdir()) == [MARKER, "1994-01-100", "1994-01-100.zip"]


def test_root_for_writes_a_missing_dataset_once_beside_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    params = SOURCES.get("mnist").Params(root=str(cache))
    assert standin.root_for("digits", SOURCES.get("digits").Params()) is None
    with pytest.raises(DatasetMissing, match=f"standin mnist --root {cache / 'standin'}"):
        require("mnist", cache)
    assert standin.root_for("mnist", params) == str(cache / "standin")
    written = _marker(cache / "standin" / "mnist")
    assert standin.root_for("mnist", params) == str(cache / "standin")
    assert _marker(cache / "standin" / "mnist") == written  # not written again
    mark_complete(cache, "mnist")
    assert standin.root_for("mnist", params) is None  # the spec's root has the data


def test_a_run_on_a_standin_says_so_and_records_it(root: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    spec = small_spec_dict(dataset={"name": "mnist", "root": str(root)},
                           scenario={"name": "iid"}, federation__num_clients=2,
                           federation__rounds=1, eval_every=1)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    assert run_main([str(tmp_path / "spec.yaml"), "--out", str(out), "--backend", "local"]) == 0
    lines = capsys.readouterr().out.splitlines()
    said = standin.notice("mnist", root / "mnist")
    assert said.startswith("STAND-IN DATA: mnist at ") and lines[0] == said == lines[-1]
    assert results.load(str(out))["trials"]["data_origin"].tolist() == ["standin"]


def test_cli_writes_and_lists_standins_as_such(tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    target = tmp_path / "standin"
    assert datasets_main(["standin", "mnist", "--root", str(target), "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert (f"mnist: stand-in written to {target / 'mnist'} (seed 3, preset size: train 1,000, "
            "t10k 200)") in out
    assert f"dataset.root: {target}\n" in out
    for listed, state, written in ((target, "STAND-IN", "-"), (tmp_path, "absent", "written")):
        assert datasets_main(["list", "--root", str(listed)]) == 0
        row = next(line for line in capsys.readouterr().out.splitlines()
                   if line.startswith("mnist "))
        assert row.split()[1:3] == [state, written]
    assert datasets_main(["verify", "mnist", "--root", str(target)]) == 0
    assert "(STAND-IN" in capsys.readouterr().out
    assert datasets_main(["path", "mnist", "--root", str(target)]) == 0
    printed = capsys.readouterr()
    assert printed.out == f"{target / 'mnist'}\n" and "STAND-IN DATA: mnist" in printed.err
    assert datasets_main(["standin", "mnist", "--seed", "-1"]) == 2
    assert "--seed: a seed is a non-negative integer, got -1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        datasets_main(["standin", "mnist2"])
    assert usage.value.code == 2 and "invalid choice: 'mnist2'" in capsys.readouterr().err
