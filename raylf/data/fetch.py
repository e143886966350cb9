"""Dataset manifests and the fetch / verify / cache layer.

A *manifest* (``datasets/<name>.yaml``) says where a real dataset comes from, which files make it
up, the digest each file must have, its licence and its tasks. :func:`fetch` downloads the files
into the cache, verifies them and unpacks archives; :func:`require` is what data sources call: it
returns the dataset folder when a completed fetch is recorded there, and otherwise raises
:class:`DatasetMissing` saying exactly how to get the data.

Cache layout (``DIR`` = :func:`data_root`)::

    DIR/<name>/<filename>          every downloaded file, verified (archives are kept)
    DIR/<name>/<extract_to>/       what an archive unpacked to (default: filename minus suffix)
    DIR/<name>/.complete           completion marker, JSON, written last

Guarantees:

* a file reaches its final name only after its size and digest were checked (it is streamed to a
  temporary file in the same folder and renamed); an archive is unpacked into a temporary folder
  next to its target and renamed into place;
* a wrong digest, a short download or a broken archive raise :class:`DatasetError` (expected vs
  actual) and leave no temporary file, no final file and no half-unpacked folder behind;
* the marker is written last, so its presence means "complete"; fetching a complete dataset again
  is a no-op that touches no network;
* data without a published digest are refused unless the caller passes ``allow_unverified=True``.

This module imports only the standard library, pydantic and PyYAML.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

try:  # POSIX only; on other platforms concurrent fetches are simply not serialized
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "DatasetError",
    "DatasetMissing",
    "FileSpec",
    "Manifest",
    "MARKER",
    "data_root",
    "fetch",
    "is_complete",
    "list_manifests",
    "load_manifest",
    "main",
    "manifest_dir",
    "require",
    "verify",
]

log = logging.getLogger(__name__)

MARKER = ".complete"
MARKER_VERSION = 1
ENV_VAR = "RAYLF_DATA"
FETCH_COMMAND = "python -m raylf.datasets fetch"
_CHUNK = 1 << 20
_TIMEOUT_S = 60.0
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip", ".gz")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_]*$")
_PLAIN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+ -]*$")
_HEX_RE = re.compile(r"^[0-9a-f]+$")


class DatasetError(RuntimeError):
    """A dataset cannot be fetched, verified or found."""


class DatasetMissing(DatasetError):
    """The dataset is not (completely) present in the cache; the message says how to fetch it."""


# --------------------------------------------------------------------------------------------
# cache root and manifest files


def data_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The cache root: ``root`` if given, else ``$RAYLF_DATA``, else ``$XDG_CACHE_HOME/raylf/data``
    (``~/.cache/raylf/data`` when XDG_CACHE_HOME is unset or not absolute)."""
    if root is not None and str(root) != "":
        return Path(root).expanduser().absolute()
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return Path(env).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return (base / "raylf" / "data").absolute()


def manifest_dir() -> Path:
    """The repository's ``datasets/`` folder holding one ``<name>.yaml`` per dataset."""
    return Path(__file__).resolve().parents[2] / "datasets"


# --------------------------------------------------------------------------------------------
# manifest model


def _archive_suffix(filename: str) -> str | None:
    low = filename.lower()
    for suffix in _ARCHIVE_SUFFIXES:  # longest first where they overlap (.tar.gz before .gz)
        if low.endswith(suffix) and len(low) > len(suffix):
            return suffix
    return None


def _check_plain_name(value: str, what: str) -> str:
    if not _PLAIN_NAME_RE.match(value) or value in (".", "..") or "/" in value or "\\" in value:
        raise ValueError(
            f"{what} must be a plain file name (letters, digits, '._+- ', not starting with '.'), "
            f"got {value!r}"
        )
    return value


class FileSpec(BaseModel):
    """One file of a dataset: where it comes from and what it must hash to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="http(s):// or file:// URL")
    filename: str = Field(description="name of the file inside the dataset folder")
    sha256: str | None = Field(default=None, description="hex SHA-256 of the file as downloaded")
    md5: str | None = Field(default=None, description="hex MD5 of the file as downloaded")
    extract: bool = Field(default=False, description="unpack (.tar.gz/.tgz/.tar/.zip/.gz)")
    extract_to: str | None = Field(
        default=None,
        description="folder (file, for .gz) the archive unpacks to; default: filename minus suffix",
    )
    size: int | None = Field(default=None, gt=0, description="size in bytes, when published")
    mirrors: list[str] = Field(default_factory=list, description="alternative URLs, tried in order")

    @field_validator("url", "mirrors")
    @classmethod
    def _scheme(cls, value: Any) -> Any:
        for url in [value] if isinstance(value, str) else value:
            scheme = urllib.parse.urlsplit(url).scheme.lower()
            if scheme not in ("http", "https", "file"):
                raise ValueError(f"URL scheme must be http, https or file, got {url!r}")
        return value

    @field_validator("filename")
    @classmethod
    def _filename(cls, value: str) -> str:
        return _check_plain_name(value, "filename")

    @field_validator("extract_to")
    @classmethod
    def _extract_to(cls, value: str | None) -> str | None:
        return None if value is None else _check_plain_name(value, "extract_to")

    @field_validator("md5", "sha256")
    @classmethod
    def _hex(cls, value: str | None, info: Any) -> str | None:
        if value is None:
            return None
        value = value.strip().lower()
        length = 32 if info.field_name == "md5" else 64
        if len(value) != length or not _HEX_RE.match(value):
            raise ValueError(f"{info.field_name} must be {length} hex digits, got {value!r}")
        return value

    @model_validator(mode="after")
    def _archive(self) -> FileSpec:
        if self.extract and _archive_suffix(self.filename) is None:
            raise ValueError(
                f"extract: true needs an archive filename ending in one of "
                f"{', '.join(_ARCHIVE_SUFFIXES)}; got {self.filename!r}"
            )
        if self.extract_to is not None and not self.extract:
            raise ValueError("extract_to is only meaningful with extract: true")
        if self.extract and self.target == self.filename:
            raise ValueError(f"extract_to must differ from filename {self.filename!r}")
        return self

    @property
    def digests(self) -> dict[str, str]:
        """Published digests, algorithm -> hex (sha256 first)."""
        out = {}
        if self.sha256:
            out["sha256"] = self.sha256
        if self.md5:
            out["md5"] = self.md5
        return out

    @property
    def algorithm(self) -> str | None:
        """The algorithm checked first ('sha256' or 'md5'), None when no digest is published."""
        return next(iter(self.digests), None)

    @property
    def verified(self) -> bool:
        return bool(self.digests)

    @property
    def urls(self) -> list[str]:
        return [self.url, *self.mirrors]

    @property
    def target(self) -> str | None:
        """Name (inside the dataset folder) an archive unpacks to; None when not extracted."""
        if not self.extract:
            return None
        if self.extract_to is not None:
            return self.extract_to
        suffix = _archive_suffix(self.filename) or ""
        return self.filename[: len(self.filename) - len(suffix)]

    def describe_digest(self) -> str:
        if not self.digests:
            return "no published digest (unverified)"
        return ", ".join(f"{alg} {hexd}" for alg, hexd in self.digests.items())


class Manifest(BaseModel):
    """A dataset manifest (``datasets/<name>.yaml``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    licence: str
    citation: str
    homepage: str
    input_shape: list[int] = Field(
        description="C x H x W for images; [sequence length] for text", min_length=1, max_length=3
    )
    tasks: dict[str, list[str]] = Field(description="task name -> class names (index order)")
    files: list[FileSpec] = Field(min_length=1)
    note: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError(f"name must match {_NAME_RE.pattern}, got {value!r}")
        return value

    @field_validator("input_shape")
    @classmethod
    def _shape(cls, value: list[int]) -> list[int]:
        if any(v <= 0 for v in value):
            raise ValueError(f"input_shape entries must be positive, got {value}")
        return value

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        if not value:
            raise ValueError("at least one task is required")
        for task, classes in value.items():
            if len(classes) < 2:
                raise ValueError(f"task {task!r} needs at least two classes, got {classes}")
            if len(set(classes)) != len(classes):
                raise ValueError(f"task {task!r} has duplicate class names")
        return value

    @model_validator(mode="after")
    def _files(self) -> Manifest:
        names: set[str] = set()
        for spec in self.files:
            for produced in filter(None, (spec.filename, spec.target)):
                if produced in names or produced == MARKER:
                    raise ValueError(f"two files produce the same name {produced!r}")
                names.add(produced)
        if any(not f.verified for f in self.files) and not (self.note or "").strip():
            raise ValueError(
                "a file without sha256/md5 needs a `note:` saying why the digest is unverified"
            )
        return self

    @property
    def verified(self) -> bool:
        """True when every file has a published digest."""
        return all(f.verified for f in self.files)


def load_manifest(name: str) -> Manifest:
    """Read and validate ``datasets/<name>.yaml``."""
    folder = manifest_dir()
    path = folder / f"{name}.yaml"
    if not _NAME_RE.match(name or "") or not path.is_file():
        known = _manifest_names(folder)
        listing = ", ".join(known) if known else f"(none found in {folder})"
        raise DatasetError(
            f"unknown dataset {name!r}: no manifest {path}. Known datasets: {listing}"
        )
    return _read_manifest(path)


def list_manifests() -> list[Manifest]:
    """Every manifest in ``datasets/``, sorted by name."""
    folder = manifest_dir()
    return [_read_manifest(folder / f"{n}.yaml") for n in _manifest_names(folder)]


def _manifest_names(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.yaml") if _NAME_RE.match(p.stem))


def _read_manifest(path: Path) -> Manifest:
    try:
        with path.open("r", encoding="utf-8") as fh:
            raw = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as exc:
        raise DatasetError(f"cannot read manifest {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise DatasetError(f"manifest {path} must be a mapping, got {type(raw).__name__}")
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as exc:
        raise DatasetError(f"invalid manifest {path}:\n{exc}") from exc
    if manifest.name != path.stem:
        raise DatasetError(
            f"manifest {path} declares name {manifest.name!r}; must be {path.stem!r}"
        )
    return manifest


# --------------------------------------------------------------------------------------------
# marker


def _marker_path(folder: Path) -> Path:
    return folder / MARKER


def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(_marker_path(folder).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _marker_matches(folder: Path, manifest: Manifest) -> bool:
    """The marker exists, records every manifest file with the manifest's digests, and every
    recorded path is still there."""
    data = _read_marker(folder)
    if data is None or data.get("name") != manifest.name:
        return False
    recorded = {f.get("filename"): f for f in data.get("files", []) if isinstance(f, dict)}
    for spec in manifest.files:
        entry = recorded.get(spec.filename)
        if entry is None:
            return False
        for alg, hexd in spec.digests.items():
            if entry.get(alg) != hexd:
                return False
        if not (folder / spec.filename).exists():
            return False
        if spec.target is not None and not (folder / spec.target).exists():
            return False
    return True


def is_complete(
    name: str, root: str | os.PathLike[str] | None = None, manifest: Manifest | None = None
) -> bool:
    """True when ``name`` has a completion marker matching its manifest under the cache root."""
    manifest = manifest or load_manifest(name)
    return _marker_matches(data_root(root) / name, manifest)


# --------------------------------------------------------------------------------------------
# require


def require(
    name: str, root: str | os.PathLike[str] | None = None, manifest: Manifest | None = None
) -> Path:
    """The dataset folder if a complete fetch is recorded there; else :class:`DatasetMissing`
    with the fetch command and the files to place by hand."""
    manifest = _resolve_manifest(name, manifest)
    base = data_root(root)
    folder = base / name
    if _marker_matches(folder, manifest):
        return folder
    raise DatasetMissing(_missing_message(name, manifest, base, folder))


def _missing_message(name: str, manifest: Manifest, base: Path, folder: Path) -> str:
    flag = "" if manifest.verified else " --allow-unverified"
    lines = [
        f"dataset {name!r} is not present under {base} (no valid completion marker "
        f"{folder / MARKER}).",
        "Fetch it with:",
        f"    {FETCH_COMMAND} {name} --root {base}{flag}",
        f"(or set {ENV_VAR}={base} and omit --root). Without internet access, place these files "
        f"in {folder}/ and run the same command: it verifies them and skips their download:",
    ]
    for spec in manifest.files:
        lines.append(f"    {spec.filename}  [{spec.describe_digest()}]  from {spec.url}")
    if not manifest.verified:
        lines.append(
            "Some files have no published digest, so their content cannot be verified; "
            "--allow-unverified accepts them as they are."
        )
    if manifest.note:
        lines.append(f"Note: {manifest.note.strip()}")
    return "\n".join(lines)


def _resolve_manifest(name: str, manifest: Manifest | None) -> Manifest:
    if manifest is None:
        return load_manifest(name)
    if manifest.name != name:
        raise DatasetError(f"manifest is for {manifest.name!r}, not {name!r}")
    return manifest


# --------------------------------------------------------------------------------------------
# fetch


def fetch(
    name: str,
    root: str | os.PathLike[str] | None = None,
    manifest: Manifest | None = None,
    *,
    allow_unverified: bool = False,
    force: bool = False,
    timeout: float = _TIMEOUT_S,
    progress: bool = False,
) -> Path:
    """Download, verify and unpack ``name`` into ``data_root(root)/name``; return that folder.

    A dataset whose completion marker matches the manifest is returned at once (no network).
    Files already present under their final name are verified and reused (manual placement,
    resumed fetches). ``force`` discards the marker and re-verifies every file. Files without a
    published digest are refused unless ``allow_unverified``.
    """
    manifest = _resolve_manifest(name, manifest)
    base = data_root(root)
    folder = base / name
    if not force and _marker_matches(folder, manifest):
        return folder

    unverified = [f.filename for f in manifest.files if not f.verified]
    if unverified and not allow_unverified:
        raise DatasetError(
            f"dataset {name!r}: no published digest for {', '.join(unverified)}, so a download "
            f"cannot be verified; refusing. Add sha256/md5 to datasets/{name}.yaml from a source "
            f"you trust, or accept the data unverified with allow_unverified=True "
            f"(CLI: --allow-unverified)."
            + (f" Note: {manifest.note.strip()}" if manifest.note else "")
        )

    base.mkdir(parents=True, exist_ok=True)
    with _lock(base / f".{name}.lock"):
        if not force and _marker_matches(folder, manifest):  # another process finished it
            return folder
        folder.mkdir(parents=True, exist_ok=True)
        _clean_stale_temps(folder)
        with contextlib.suppress(FileNotFoundError):
            _marker_path(folder).unlink()  # from here on the dataset reads as absent
        records = []
        try:
            for spec in manifest.files:
                digests = _obtain(spec, folder, timeout=timeout, progress=progress, force=force)
                if spec.extract:
                    _extract(spec, folder)
                records.append(
                    {
                        "filename": spec.filename,
                        "url": spec.url,
                        "size": (folder / spec.filename).stat().st_size,
                        "verified": spec.verified,
                        "extracted_to": spec.target,
                        **digests,
                    }
                )
        except BaseException:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only succeeds when nothing (verified) was kept
            raise
        marker = {
            "version": MARKER_VERSION,
            "name": name,
            "verified": manifest.verified,
            "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": records,
        }
        _atomic_write_text(_marker_path(folder), json.dumps(marker, indent=2) + "\n")
    return folder


def verify(
    name: str, root: str | os.PathLike[str] | None = None, manifest: Manifest | None = None
) -> Path:
    """Re-hash every kept file of a fetched dataset against the manifest (slow, thorough)."""
    folder = require(name, root, manifest)
    manifest = _resolve_manifest(name, manifest)
    for spec in manifest.files:
        path = folder / spec.filename
        if spec.verified:
            actual = _hash_file(path, spec.digests)
            _check_digests(spec, actual, str(path))
    return folder


def _obtain(
    spec: FileSpec, folder: Path, *, timeout: float, progress: bool, force: bool
) -> dict[str, str]:
    """Make ``folder/spec.filename`` exist and verified; return its digests (sha256 always)."""
    dest = folder / spec.filename
    wanted = {"sha256": "", **spec.digests}
    if dest.is_file():
        actual = _hash_file(dest, wanted)
        try:
            _check_size(spec, dest.stat().st_size, None, str(dest))
            _check_digests(spec, actual, str(dest))
        except DatasetError as exc:
            log.warning("discarding %s: %s", dest, exc)
            dest.unlink()
        else:
            if spec.verified or not force:
                return actual
            dest.unlink()

    errors: list[str] = []
    for url in spec.urls:
        try:
            return _download(url, spec, dest, timeout=timeout, progress=progress)
        except _NetworkError as exc:
            errors.append(f"{url}: {exc}")
            log.warning("download failed, trying next source: %s: %s", url, exc)
    raise DatasetError(f"could not download {spec.filename}:\n  " + "\n  ".join(errors))


class _NetworkError(Exception):
    """Transport-level failure (the next mirror may work); integrity failures are DatasetError."""


def _download(
    url: str, spec: FileSpec, dest: Path, *, timeout: float, progress: bool
) -> dict[str, str]:
    fd, tmp_name = tempfile.mkstemp(prefix=f".{spec.filename}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        hashers = {alg: hashlib.new(alg) for alg in {"sha256", *spec.digests}}
        received = 0
        expected_len: int | None = None
        with os.fdopen(fd, "wb") as out:
            try:
                response = urllib.request.urlopen(url, timeout=timeout)  # noqa: S310 (schemes checked)
            except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
                raise _NetworkError(str(exc)) from exc
            with response:
                header = response.headers.get("Content-Length") if response.headers else None
                if header and header.isdigit():
                    expected_len = int(header)
                if progress:
                    print(f"downloading {url} -> {dest}", file=sys.stderr)
                try:
                    while chunk := response.read(_CHUNK):
                        out.write(chunk)
                        received += len(chunk)
                        for h in hashers.values():
                            h.update(chunk)
                except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
                    raise DatasetError(
                        f"download of {spec.filename} from {url} broke off after {received} "
                        f"bytes: {exc}"
                    ) from exc
            out.flush()
            os.fsync(out.fileno())
        if expected_len is not None and received != expected_len:
            raise DatasetError(
                f"truncated download of {spec.filename} from {url}: expected {expected_len} "
                f"bytes (Content-Length), got {received}"
            )
        actual = {alg: h.hexdigest() for alg, h in hashers.items()}
        _check_size(spec, received, url, spec.filename)
        _check_digests(spec, actual, f"{spec.filename} from {url}")
        os.replace(tmp, dest)
        return actual
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def _check_size(spec: FileSpec, actual: int, url: str | None, what: str) -> None:
    if spec.size is not None and actual != spec.size:
        kind = "truncated download" if actual < spec.size else "size mismatch"
        raise DatasetError(
            f"{kind} of {what}: expected {spec.size} bytes, got {actual}"
            + (f" (from {url})" if url else "")
        )


def _check_digests(spec: FileSpec, actual: dict[str, str], what: str) -> None:
    for alg, expected in spec.digests.items():
        if actual.get(alg) != expected:
            raise DatasetError(
                f"checksum mismatch for {what}: expected {alg} {expected}, "
                f"actual {alg} {actual.get(alg)} (the file was not kept; the download may be "
                f"truncated or corrupted, or the source changed)"
            )


def _hash_file(path: Path, algorithms: dict[str, str] | Sequence[str]) -> dict[str, str]:
    hashers = {alg: hashlib.new(alg) for alg in algorithms}
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            for h in hashers.values():
                h.update(chunk)
    return {alg: h.hexdigest() for alg, h in hashers.items()}


# --------------------------------------------------------------------------------------------
# extraction


def _extract(spec: FileSpec, folder: Path) -> None:
    """Unpack ``folder/filename`` into a temporary sibling and rename it to ``folder/target``.
    A broken archive removes the archive itself and raises DatasetError."""
    archive = folder / spec.filename
    target = folder / (spec.target or "")
    suffix = _archive_suffix(spec.filename)
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.target}.", suffix=".extracting", dir=folder))
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
                    shutil.copyfileobj(src, dst, _CHUNK)
        except (
            tarfile.TarError,
            zipfile.BadZipFile,
            gzip.BadGzipFile,
            EOFError,
            OSError,
            ValueError,
            zlib.error,
        ) as exc:
            with contextlib.suppress(FileNotFoundError):
                archive.unlink()
            raise DatasetError(
                f"broken archive {spec.filename}: {type(exc).__name__}: {exc} "
                f"(expected a valid {suffix} archive; the file was removed)"
            ) from exc
        _replace(produced, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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


def _replace(src: Path, dst: Path) -> None:
    """Atomically put ``src`` at ``dst``; an existing ``dst`` is moved aside first and removed."""
    old: Path | None = None
    if dst.exists() or dst.is_symlink():
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}-{time.monotonic_ns()}")
        os.replace(dst, old)
    try:
        os.replace(src, dst)
    except BaseException:
        if old is not None:
            os.replace(old, dst)
        raise
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------
# helpers


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _clean_stale_temps(folder: Path) -> None:
    """Remove leftovers of an interrupted fetch (we hold the lock, so none is in use)."""
    for p in folder.iterdir():
        if p.name.startswith(".") and (
            p.name.endswith((".part", ".extracting")) or ".old-" in p.name
        ):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock so concurrent fetches of one dataset (several Ray workers on
    one node) do not interleave. No-op where fcntl is unavailable."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# command line (``python -m raylf.datasets`` delegates here)


def main(argv: Sequence[str] | None = None) -> int:
    """``list`` / ``fetch NAME... [--root DIR] [--allow-unverified] [--force]`` /
    ``verify NAME...`` / ``path NAME``. Exit 0 on success, 1 on a dataset error, 2 on usage."""
    parser = argparse.ArgumentParser(
        prog="python -m raylf.datasets", description="raylf dataset manifests and cache"
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list the manifests and whether each is present")
    p_fetch = sub.add_parser("fetch", help="download, verify and unpack datasets")
    p_fetch.add_argument("names", nargs="+", metavar="NAME")
    p_fetch.add_argument(
        "--allow-unverified", action="store_true", help="accept files that have no published digest"
    )
    p_fetch.add_argument("--force", action="store_true", help="re-verify even if complete")
    p_verify = sub.add_parser("verify", help="re-hash the files of fetched datasets")
    p_verify.add_argument("names", nargs="+", metavar="NAME")
    p_path = sub.add_parser("path", help="print the folder of a fetched dataset")
    p_path.add_argument("names", nargs=1, metavar="NAME")
    for p in (sub.choices["list"], p_fetch, p_verify, p_path):
        p.add_argument(
            "--root",
            default=None,
            help=f"cache root (default: ${ENV_VAR}, else ~/.cache/raylf/data)",
        )
    args = parser.parse_args(argv)
    try:
        if args.cmd == "list":
            root = data_root(args.root)
            print(f"cache root: {root}")
            for m in list_manifests():
                state = "present" if _marker_matches(root / m.name, m) else "absent"
                digest = "verified" if m.verified else "UNVERIFIED"
                tasks = ", ".join(f"{t}({len(c)})" for t, c in m.tasks.items())
                print(f"{m.name:18s} {state:8s} {digest:10s} {tasks}")
        elif args.cmd == "fetch":
            for name in args.names:
                path = fetch(
                    name,
                    args.root,
                    allow_unverified=args.allow_unverified,
                    force=args.force,
                    progress=True,
                )
                print(f"{name}: {path}")
        elif args.cmd == "verify":
            for name in args.names:
                print(f"{name}: ok {verify(name, args.root)}")
        else:
            print(require(args.names[0], args.root))
    except DatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
