"""Unpacking a downloaded archive inside its dataset folder.

The archive is unpacked into a temporary folder next to its target and renamed into place, so the
target is either the complete tree or absent. Members with absolute or ``..`` paths, links and
device files are refused; the files the manifest lists as the archive's ``members`` must be there
with their digests. A broken archive, or one whose members do not match, is removed and raises
:class:`DatasetError`; one that cannot be unpacked for want of space or permissions is kept.
"""

from __future__ import annotations

import contextlib
import gzip
import re
import shutil
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from raylf.data import atomic_files
from raylf.data.download import check_digests, hash_file
from raylf.data.manifest import DatasetError, FileSpec, archive_suffix

# What a damaged archive raises while it is read. gzip's BadGzipFile is an OSError, but every
# other OSError (a full disk, a folder without write permission) says nothing about the
# archive, which is then kept.
FORMAT_ERRORS = (tarfile.TarError, zipfile.BadZipFile, gzip.BadGzipFile, EOFError, ValueError,
                 zlib.error)


def extract(spec: FileSpec, folder: Path) -> None:
    """Unpack ``folder/spec.filename`` to ``folder/spec.target`` (a folder; a file for ``.gz``)."""
    archive = folder / spec.filename
    target = folder / (spec.target or "")
    suffix = archive_suffix(spec.filename)
    tmp = atomic_files.extracting_dir(target)
    try:
        try:
            if suffix in (".tar.gz", ".tgz", ".tar"):
                _extract_tar(archive, tmp)
                produced = tmp
            elif suffix == ".zip":
                _extract_zip(archive, tmp)
                produced = tmp
            else:  # .gz: a single compressed file
                produced = tmp / "data"
                with gzip.open(archive, "rb") as src, produced.open("wb") as dst:
                    shutil.copyfileobj(src, dst, atomic_files.CHUNK)
        except FORMAT_ERRORS as exc:
            _discard(archive)
            raise DatasetError(
                f"broken archive {spec.filename}: {type(exc).__name__}: {exc} "
                f"(expected a valid {suffix} archive; the file was removed)"
            ) from exc
        except OSError as exc:  # the disk, not the archive: keep the verified download
            raise DatasetError(
                f"cannot unpack {spec.filename} into {folder}: {exc}. The verified download "
                f"was kept; free space (or fix the permissions) there and fetch again: it is "
                "unpacked without downloading it again"
            ) from exc
        try:
            _check_members(spec, produced)
        except DatasetError:
            _discard(archive)
            raise
        atomic_files.replace(produced, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _discard(archive: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        archive.unlink()


def _check_members(spec: FileSpec, unpacked: Path) -> None:
    """Every member the manifest lists is in the unpacked tree with its digests."""
    consequence = ("the archive was removed; fetch it again, and if this recurs the manifest's "
                   "member digest does not describe this archive")
    for member in spec.members:
        path = unpacked / member.path
        if not path.is_file():
            raise DatasetError(f"archive {spec.filename} lacks {member.path}, which its manifest "
                               f"lists ({consequence})")
        check_digests(member, hash_file(path, member.digests),
                      f"{member.path} in {spec.filename}", consequence)


def _safe_member(name: str) -> bool:
    path = PurePosixPath(name.replace("\\", "/"))
    return not path.is_absolute() and ".." not in path.parts and not re.match(r"^[A-Za-z]:", name)


def _extract_tar(archive: Path, dest: Path) -> None:
    with tarfile.open(archive, "r:*") as tf:
        members = tf.getmembers()
        for m in members:
            if not _safe_member(m.name):
                raise ValueError(f"unsafe path in archive: {m.name!r}")
            if m.issym() or m.islnk() or m.isdev():
                raise ValueError(f"links and device files are not accepted: {m.name!r}")
        if hasattr(tarfile, "data_filter"):
            tf.extractall(dest, members=members, filter="data")
        else:  # pragma: no cover - Python < 3.11.4
            tf.extractall(dest, members=members)


def _extract_zip(archive: Path, dest: Path) -> None:
    with zipfile.ZipFile(archive) as zf:
        bad = zf.testzip()
        if bad is not None:
            raise zipfile.BadZipFile(f"CRC error in member {bad!r}")
        for name in zf.namelist():
            if not _safe_member(name):
                raise ValueError(f"unsafe path in archive: {name!r}")
        zf.extractall(dest)
