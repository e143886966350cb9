"""Format-true stand-ins for the downloadable datasets: seeded random content in exactly the files
and on-disk layout of the real downloads, put into a root through the real fetch path.

Why: a paper-scale spec cannot be checked before its data are fetched, and the data are large
and need the internet. A stand-in runs everything the real data would run through: the archive
formats, fetch's digest checks, unpacking and member verification, the readers (torchvision's
IDX and CIFAR-pickle readers, the LEAF Shakespeare parser, the MedIMeta reader), every paper
preset's partition and the real models, in seconds and a few MB. It says nothing about accuracy.

How: :func:`write` generates the *downloaded* files (``cifar-10-python.tar.gz``, the four IDX
``.gz`` files, ``1994-01-100.zip``, ``pneumonia.zip``, …, named and laid out as the manifest
says) into a temporary source folder, and fetches them from there (``file://`` URLs) with the
shipped manifest's digests replaced by the stand-in's own: fetch verifies each file, unpacks
it, checks every listed archive member and writes the completion marker, which records
``"origin": "standin"``, the seed and the size. The finished folder is then moved into place
whole, so a half-written stand-in never sits where data are looked for.

A stand-in never passes for real data:

- it lives in a root of its own (:func:`standin_root`, ``<cache root>/standin/`` by default), and
  a spec reads it only by naming that root as ``dataset.root``;
- it is never written into a folder holding the real dataset or any file that is not a
  stand-in's (:class:`StandinRefused`), and a real fetch into its folder removes it first;
- its files are checked against the digests its own marker records (the shipped manifest
  describes the real files), CIFAR's pickles on every read as for real data;
- its source reports ``origin == "standin"``, the trials table's ``data_origin`` says so, and
  ``python -m raylf.run`` and ``raylf.sweep`` print :func:`notice` for every run that reads one.

Content: images are drawn per class (a random prototype per class plus per-image noise, on a
grid of square cells so that the archives stay small), so a model can fit them and a run's
learning check has something to see; labels are balanced. Shakespeare is random words in the
Gutenberg layout LEAF parses (plays, indented speeches of named roles, one play printed flush,
the sonnets). The same seed gives the same bytes. Sizes (:data:`SIZES`) are the
smallest that build every paper preset of :mod:`raylf.data.presets` with margin.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from raylf.data import atomic_files, cache, medimeta
from raylf.data.cache import dataset_origin, standin_root
from raylf.data.manifest import DatasetError, FileSpec, Manifest, load_manifest, manifest_names

__all__ = ["StandinRefused", "dataset_origin", "notice", "root_for", "standin_root", "write"]

@dataclass(frozen=True)
class Size:
    """How much a stand-in holds. ``per_class``: samples per class of the image stand-ins
    (training files, test files; MedIMeta: images per 3-class label, its splits being index
    lists). Shakespeare: ``plays`` indented plays (plus one printed flush) of ``ROLES`` roles,
    each role ``speeches`` (low, high exclusive) speeches of 2-4 lines, ~100 characters each."""

    per_class: dict[str, tuple[int, ...]]
    plays: int
    speeches: tuple[int, int]


SIZES = {
    # every paper preset at its own client count: CIFAR-10 Dirichlet(0.07) over 20 clients needs
    # ~100 samples per class before the rejection loop gives every client 4 samples within a
    # few dozen of its 1,000 draws; MNIST's 89-client rotation continuum leaves every client ~13
    # samples; 30 MedIMeta images per label for FMT-SVM's 5 clients; 4-7 speeches give every
    # role ≥ 350 characters (seeds 0-2), above the ≥ 150 windows of 50 that the natural presets
    # draw from (min_samples 100 + gap 50), and n15-m7 draws 105 of the 154 roles
    "preset": Size({"mnist": (100, 20), "fashion_mnist": (100, 20), "cifar10": (100, 20),
                    "cifar100": (10, 2), "pneumonia": (30,), "breast_ultrasound": (30,)},
                   plays=10, speeches=(4, 8)),
    # a smoke run's (raylf.sweep.smoke: at most 10 clients, 2 of them training per round): the
    # least that builds every configuration of tune/*.yaml with 10 clients (checked 2026-12-03),
    # so a ResNet-18 on a CPU trains seconds per trial; 2 speeches a role leave about two thirds of
    # the 98 roles above 150 windows, enough for 10 clients of 7 roles (seeds 0-2, checked
    # 2026-12-03), with half the characters per client of 3-4 speeches over 70 roles: the
    # CharLSTM paths were 2/3 of the suite's smoke run
    "smoke": Size({"mnist": (12, 3), "fashion_mnist": (12, 3), "cifar10": (12, 3),
                   "cifar100": (2, 1), "pneumonia": (10,), "breast_ultrasound": (10,)},
                  plays=6, speeches=(2, 3)),
    # the real datasets' sample counts, for timing (``raylf.sweep --estimate`` on a machine
    # without the data): a round's compute depends on how many samples of which shape, not on
    # what they show. Balanced labels (real MNIST's classes differ by up to ±13 %, totals are
    # the same); MedIMeta: 5,856 pneumonia and 780 breast ultrasound images; Shakespeare: the 37
    # plays of Gutenberg's #100 with about 4.1 M characters of speech (LEAF counts 4.2 M), in
    # 518 roles of equal length where the real text has about 1,100 of very unequal length
    "full": Size({"mnist": (6000, 1000), "fashion_mnist": (6000, 1000),
                  "cifar10": (5000, 1000), "cifar100": (500, 100), "pneumonia": (1952,),
                  "breast_ultrasound": (260,)},
                 plays=36, speeches=(30, 80)),
}
ROLES = 14  # roles per play
_NOISE = 48.0  # std of the per-image noise around the class prototype, in 0-255 pixel units
# 3-class labels whose binary label is 1, as in the real data: pneumonia = bacteria or virus;
# a malignant finding = the malignant case category
_POSITIVE = {"pneumonia": (1, 2), "breast_ultrasound": (2,)}
_STAMP = (1994, 1, 1, 0, 0, 0)  # zip entry time: fixed, so one seed gives the same bytes


class StandinRefused(DatasetError):
    """A stand-in would be written where real data (or files that are not a stand-in's) are."""


def notice(name: str, where: str | os.PathLike[str] | None = None) -> str:
    """The console line for a run on ``name``'s stand-in (``where``: its folder, if known)."""
    place = f" at {where}" if where else ""
    return (f"STAND-IN DATA: {name}{place} is random stand-in content in the real file format, "
            f"not the real {name} dataset; results say nothing about the real dataset")


def root_for(name: str, params: Any, size: str = "preset") -> str | None:
    """The root a smoke run reads ``name`` from: None when ``name`` has no manifest or its data
    (real or a stand-in) are complete in the root ``params.root`` names; else
    ``standin_root(params.root)`` (``…/smoke`` for the ``smoke`` size), with the stand-in
    written there unless one already is."""
    if name not in manifest_names():
        return None
    root = getattr(params, "root", None)
    if dataset_origin(name, root) is not None:
        return None
    target = standin_root(root) / size if size != "preset" else standin_root(root)
    if dataset_origin(name, target) != cache.STANDIN:
        write(name, target, size=size)
    return str(target)


def write(name: str, root: str | os.PathLike[str] | None = None, *, seed: int = 0,
          size: str = "preset") -> Path:
    """Write the stand-in of ``name`` at ``size`` (:data:`SIZES`) into ``root`` (default
    :func:`standin_root`) through the real fetch and return its folder ``<root>/<name>``; a
    stand-in already there is replaced.

    Refuses (:class:`StandinRefused`) when ``<root>/<name>`` holds anything but a stand-in: the
    real dataset, a partial fetch or files placed there by hand for fetch.
    """
    shipped = load_manifest(name)
    base = cache.data_root(root) if root is not None and str(root) else standin_root()
    folder = base / name
    base.mkdir(parents=True, exist_ok=True)
    with cache.lock(base, name):
        _refuse_non_standin(name, folder)
        with tempfile.TemporaryDirectory(prefix=f".{name}.standin-", dir=base) as tmp:
            source, staging = Path(tmp) / "source", Path(tmp) / "root"
            source.mkdir()
            members, counts = _WRITERS[name](name, source, np.random.default_rng(seed),
                                             SIZES[size])
            cache.fetch(name, staging, _manifest(shipped, source, members),
                        standin={"seed": seed, "size": size, "counts": counts})
            atomic_files.replace(staging / name, folder)
    return folder


def _refuse_non_standin(name: str, folder: Path) -> None:
    marker = cache.read_marker(folder)
    if marker is not None and marker.get("origin") == cache.STANDIN:
        return
    if folder.is_dir() and any(folder.iterdir()):
        what = ("the real dataset" if dataset_origin(name, folder.parent) == cache.REAL else
                "files that are not a stand-in's (a partial fetch, or files placed for fetch)")
        default = standin_root()
        other = "" if folder.parent == default else f" (the default is {default})"
        raise StandinRefused(
            f"{folder} holds {what}; a stand-in is never written where real data may be. "
            f"Write it into a root of its own with --root DIR, a folder without {name}{other}")


def _manifest(shipped: Manifest, source: Path, members: dict[str, bytes]) -> Manifest:
    """The shipped manifest pointed at the stand-in's files (``file://``), with their sizes and
    SHA-256 and those of every archive member it lists, so fetch verifies them for real."""
    files = []
    for spec in shipped.files:
        path = source / spec.filename
        files.append(FileSpec.model_validate({
            **spec.model_dump(), "url": path.as_uri(), "mirrors": [], "md5": None,
            "size": path.stat().st_size, "sha256": _sha256(path.read_bytes()),
            "members": [{"path": m.path, "sha256": _sha256(members[m.path])}
                        for m in spec.members]}))
    return shipped.model_copy(update={"files": files})


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------------------
# archive formats, written byte-for-byte reproducibly (no timestamps)


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _tar_gz(path: Path, members: dict[str, bytes]) -> None:
    """A gzipped tar holding each member's folders, then the member files."""
    folders = sorted({str(Path(m).parent) for m in members} - {"."})
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in folders:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())


def _zip(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name, _STAMP), data, zipfile.ZIP_DEFLATED)


# ------------------------------------------------------------------------------------------
# images


def _image_drawer(rng: np.random.Generator, classes: int, channels: int, side: int,
                  cell: int) -> Callable[[int], tuple[np.ndarray, np.ndarray]]:
    """``draw(per_class)`` → uint8 N×C×side×side images and their shuffled balanced labels:
    each the prototype of its class plus noise, on a grid of ``cell``-pixel square cells."""
    grid = side // cell
    prototypes = rng.uniform(0, 255, (classes, channels, grid, grid))

    def draw(per_class: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.permutation(np.repeat(np.arange(classes), per_class))
        cells = prototypes[y] + rng.normal(0, _NOISE, (len(y), channels, grid, grid))
        x = np.clip(cells, 0, 255).round().astype(np.uint8)
        return x.repeat(cell, axis=2).repeat(cell, axis=3), y

    return draw


def _idx(array: np.ndarray) -> bytes:
    """IDX, MNIST's format: 0, 0, type 8 (unsigned byte), the number of dimensions, each
    dimension as a big-endian int32, then the bytes."""
    head = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, ">i4").tobytes()
    return head + np.ascontiguousarray(array, np.uint8).tobytes()


def _idx_files(name: str, source: Path, rng: np.random.Generator, size: Size
               ) -> tuple[dict[str, bytes], dict[str, int]]:
    """MNIST / Fashion-MNIST: four gzipped IDX files, 28×28 grey images and their labels."""
    draw = _image_drawer(rng, 10, 1, 28, 4)
    counts = {}
    for prefix, per_class in zip(("train", "t10k"), size.per_class[name]):
        x, y = draw(per_class)
        (source / f"{prefix}-images-idx3-ubyte.gz").write_bytes(_gz(_idx(x[:, 0])))
        (source / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(_gz(_idx(y)))
        counts[prefix] = len(y)
    return {}, counts


def _pickled(obj: dict[str, Any]) -> bytes:
    """A fixed protocol, so one seed gives the same bytes under any Python raylf supports (the
    real files are Python 2 pickles; readers load both alike, with ``encoding="latin1"``)."""
    return pickle.dumps(obj, protocol=4)


def _cifar_batch(x: np.ndarray, labels: dict[str, np.ndarray], label: str, first: int
                 ) -> dict[str, Any]:
    """One pickled CIFAR batch: N×3072 uint8 rows (the red, green, blue planes, row-major)."""
    return {"batch_label": label, **{k: v.tolist() for k, v in labels.items()},
            "data": x.reshape(len(x), -1),
            "filenames": [f"standin_{first + i:06d}.png" for i in range(len(x))]}


def _readme(name: str) -> bytes:
    return (f"<html><body><p>raylf stand-in of {name}: random images in the real archive "
            "layout, not the real dataset.</p></body></html>\n").encode()


def _cifar10(name: str, source: Path, rng: np.random.Generator, size: Size
             ) -> tuple[dict[str, bytes], dict[str, int]]:
    """CIFAR-10: five training batches, one test batch, batches.meta, in one .tar.gz."""
    draw = _image_drawer(rng, 10, 3, 32, 4)
    train_per_class, test_per_class = size.per_class[name]
    folder = "cifar-10-batches-py"
    x, y = draw(train_per_class)
    members, first = {}, 0
    for i, (xb, yb) in enumerate(zip(np.array_split(x, 5), np.array_split(y, 5)), 1):
        members[f"{folder}/data_batch_{i}"] = _pickled(_cifar_batch(
            xb, {"labels": yb}, f"training batch {i} of 5", first))
        first += len(yb)
    xt, yt = draw(test_per_class)
    members[f"{folder}/test_batch"] = _pickled(_cifar_batch(
        xt, {"labels": yt}, "testing batch 1 of 1", first))
    members[f"{folder}/batches.meta"] = _pickled({
        "num_cases_per_batch": len(x) // 5, "num_vis": 3072,
        "label_names": load_manifest(name).tasks["object"]})
    members[f"{folder}/readme.html"] = _readme(name)
    _tar_gz(source / "cifar-10-python.tar.gz", members)
    return members, {"train": len(y), "test": len(yt)}


def _cifar100(name: str, source: Path, rng: np.random.Generator, size: Size
              ) -> tuple[dict[str, bytes], dict[str, int]]:
    """CIFAR-100: train, test and meta pickles with fine and coarse labels, in one .tar.gz.
    Each coarse class holds five fine classes, as in the real set (here a random five)."""
    tasks = load_manifest(name).tasks
    draw = _image_drawer(rng, len(tasks["fine"]), 3, 32, 4)
    coarse_of = rng.permutation(np.repeat(np.arange(len(tasks["coarse"])), 5))
    members, counts, first = {}, {}, 0
    for split, per_class, label in zip(("train", "test"), size.per_class[name],
                                       ("training batch 1 of 1", "testing batch 1 of 1")):
        x, y = draw(per_class)
        members[f"cifar-100-python/{split}"] = _pickled(_cifar_batch(
            x, {"fine_labels": y, "coarse_labels": coarse_of[y]}, label, first))
        first += len(y)
        counts[split] = len(y)
    members["cifar-100-python/meta"] = _pickled({"fine_label_names": tasks["fine"],
                                                 "coarse_label_names": tasks["coarse"]})
    _tar_gz(source / "cifar-100-python.tar.gz", members)
    return members, counts


def _medimeta_zip(name: str, source: Path, rng: np.random.Generator, size: Size
                  ) -> tuple[dict[str, bytes], dict[str, int]]:
    """A MedIMeta dataset zip: ``<id>/info.yaml``, grey 224×224 ``images/NNNNNN.tiff``, one
    ``task_labels/<task name>.npy`` per task and ``splits/{train,val,test}.txt`` (sample
    indices, one per line). ``images.hdf5`` is left out: raylf's reader does not read it."""
    from PIL import Image

    dataset_id, tasks = medimeta.DATASETS[name]
    classes = list(load_manifest(name).tasks.values())
    x, y = _image_drawer(rng, len(classes[1]), 1, 224, 16)(size.per_class[name][0])
    labels = {"multiclass": y, "binary": np.isin(y, _POSITIVE[name]).astype(np.int64)}
    members = {}
    info = {"id": dataset_id, "name": f"raylf stand-in of {name}",
            "description": "random images in the MedIMeta layout; not the real dataset",
            "input_size": [1, 224, 224], "num_samples": len(y),
            "tasks": [{"task_name": tasks[key], "labels": dict(enumerate(names))}
                      for key, names in zip(("binary", "multiclass"), classes)]}
    members[f"{dataset_id}/info.yaml"] = yaml.safe_dump(info, sort_keys=False).encode()
    for i, image in enumerate(x[:, 0]):
        buf = io.BytesIO()
        Image.fromarray(image).save(buf, format="TIFF")
        members[f"{dataset_id}/images/{i:06d}.tiff"] = buf.getvalue()
    for key, task in tasks.items():
        buf = io.BytesIO()
        np.save(buf, labels[key])
        members[f"{dataset_id}/task_labels/{task}.npy"] = buf.getvalue()
    order = rng.permutation(len(y))
    for split, part in zip(("train", "val", "test"),
                           np.split(order, [len(y) * 7 // 10, len(y) * 8 // 10])):
        members[f"{dataset_id}/splits/{split}.txt"] = "".join(
            f"{i}\n" for i in np.sort(part)).encode()
    _zip(source / load_manifest(name).files[0].filename, members)
    return members, {"images": len(y)}


# ------------------------------------------------------------------------------------------
# Shakespeare: the Gutenberg text in the layout raylf.data.text (LEAF's reading) parses


def _words(rng: np.random.Generator, count: int) -> str:
    """A sentence of ``count`` random lower-case words (1-8 letters), capitalized, with some
    commas."""
    text = bytes(rng.integers(ord("a"), ord("z") + 1, 8 * count, dtype=np.uint8)).decode()
    ends = np.cumsum(rng.integers(1, 9, count))
    words = [text[start:end] for start, end in zip([0, *ends[:-1]], ends)]
    commas = rng.random(count - 1) < 0.1
    words = [w + "," if c else w for w, c in zip(words[:-1], commas)] + words[-1:]
    return " ".join(words).capitalize()


def _line(rng: np.random.Generator) -> str:
    return _words(rng, int(rng.integers(5, 11))) + str(rng.choice(list(".;:!?,")))


def _name(rng: np.random.Generator, taken: set[str]) -> str:
    while True:
        name = bytes(rng.integers(ord("A"), ord("Z") + 1, rng.integers(3, 9), np.uint8)).decode()
        if name not in taken:
            taken.add(name)
            return name


def _play(rng: np.random.Generator, title: str, flush: bool, taken: set[str],
          speeches: tuple[int, int]) -> list[str]:
    """One play: title, author line, dramatis personae, then acts of speeches. A speech is
    ``  NAME. text`` continued by four-space-indented lines, or, printed ``flush`` (as the
    Gutenberg text prints The Comedy of Errors), ``NAME. text`` continued by unindented lines,
    speeches separated by blank lines."""
    roles = [_name(rng, taken) for _ in range(ROLES)]
    turns = rng.permutation(np.repeat(np.arange(ROLES), rng.integers(*speeches, ROLES)))
    lines = [title, "", "by William Shakespeare", "", "", "Dramatis Personae", ""]
    lines += [f"  {role}, {_words(rng, 3).lower()}." for role in roles]
    indent, more = ("", "") if flush else ("  ", "    ")
    for act, turns_of_act in enumerate(np.array_split(turns, 3), 1):
        if not flush:
            lines += ["", "", f"ACT {'I' * act}. SCENE I.", f"{_words(rng, 2)}.", ""]
            lines.append(f"  Enter {roles[turns_of_act[0]]} and {roles[turns_of_act[-1]]}.")
        for turn in turns_of_act:
            lines += [""] if flush else []
            lines.append(f"{indent}{roles[turn]}. {_line(rng)}")
            lines += [f"{more}{_line(rng)}" for _ in range(int(rng.integers(1, 4)))]
    return [*lines, "", "THE END", "", ""]


def _shakespeare(name: str, source: Path, rng: np.random.Generator, size: Size
                 ) -> tuple[dict[str, bytes], dict[str, int]]:
    """``1994-01-100.zip`` holding ``100.txt``: a stand-in note where Gutenberg's header is,
    the sonnets (a poem: skipped by the parser), ``size.plays`` indented plays and a flush one."""
    taken: set[str] = set()
    lines = ["raylf STAND-IN: seeded random text in the layout of Project Gutenberg's eBook #100,",
             "The Complete Works of William Shakespeare (1994 release), as LEAF reads it.",
             "It is not Shakespeare's text; results on it say nothing about the real dataset.",
             "", "", "THE SONNETS", "", "by William Shakespeare", ""]
    for number in range(1, 4):
        lines += ["", f"                     {number}"] + [f"  {_line(rng)}" for _ in range(14)]
    lines += ["", "THE END", "", ""]
    for play in range(size.plays + 1):
        title = f"THE TRAGEDY OF {_name(rng, taken)}"
        lines += _play(rng, title, play == size.plays, taken, size.speeches)
    text = "\n".join(lines) + "\n"
    members = {"100.txt": text.encode("ascii")}
    _zip(source / "1994-01-100.zip", members)
    return members, {"plays": size.plays + 1, "roles": (size.plays + 1) * ROLES,
                     "characters": len(text)}


_WRITERS: dict[str, Callable[[str, Path, np.random.Generator, Size],
                             tuple[dict[str, bytes], dict[str, int]]]] = {
    "mnist": _idx_files, "fashion_mnist": _idx_files, "cifar10": _cifar10,
    "cifar100": _cifar100, "shakespeare": _shakespeare, "pneumonia": _medimeta_zip,
    "breast_ultrasound": _medimeta_zip,
}
