"""Dataset manifests: the schema of ``raylf/data/manifests/<name>.yaml`` and reading them.

A manifest says where a real dataset comes from, which files make it up, the digest each file must
have, its licence and its tasks. The YAML files ship inside the package and are read through
:mod:`importlib.resources`, so an installed raylf knows its datasets without the repository.
"""

from __future__ import annotations

import re
import urllib.parse
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip", ".gz")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_]*$")
# never starting with '.', so no dataset file can collide with the cache's marker or temporaries
_PLAIN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+ -]*$")
_HEX_RE = re.compile(r"^[0-9a-f]+$")


class DatasetError(RuntimeError):
    """A dataset cannot be fetched, verified or found."""


def archive_suffix(filename: str) -> str | None:
    """The archive suffix ``filename`` ends in (``.tar.gz`` wins over ``.gz``), else None."""
    low = filename.lower()
    for suffix in ARCHIVE_SUFFIXES:  # longest first where they overlap (.tar.gz before .gz)
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


class Digested(BaseModel):
    """A file with the digests it must hash to (either or both)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str | None = Field(default=None, description="hex SHA-256 of the file")
    md5: str | None = Field(default=None, description="hex MD5 of the file")

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
    def verified(self) -> bool:
        return bool(self.digests)

    def describe_digest(self) -> str:
        if not self.digests:
            return "no published digest (unverified)"
        return ", ".join(f"{alg} {hexd}" for alg, hexd in self.digests.items())


class MemberSpec(Digested):
    """A file an archive unpacks to, hashed again whenever raylf reads it (a pickled batch runs
    code as it loads, and the archive's own digest says nothing about the file on disk later)."""

    path: str = Field(description="'/'-separated path inside the folder the archive unpacks to")

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        for part in value.split("/"):
            _check_plain_name(part, "each part of a member path")
        return value

    @model_validator(mode="after")
    def _digest(self) -> MemberSpec:
        if not self.verified:
            raise ValueError(f"member {self.path!r} needs an md5 or sha256")
        return self


class FileSpec(Digested):
    """One file of a dataset: where it comes from and what it must hash to (as downloaded)."""

    url: str = Field(description="http(s):// or file:// URL")
    filename: str = Field(description="name of the file inside the dataset folder")
    extract: bool = Field(default=False, description="unpack (.tar.gz/.tgz/.tar/.zip/.gz)")
    extract_to: str | None = Field(
        default=None,
        description="folder (file, for .gz) the archive unpacks to; default: filename minus suffix",
    )
    size: int | None = Field(default=None, gt=0, description="size in bytes, when published")
    mirrors: list[str] = Field(default_factory=list, description="alternative URLs, tried in order")
    members: list[MemberSpec] = Field(
        default_factory=list, description="files the archive unpacks to that are checked when "
                                          "unpacked and again whenever they are read")

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

    @model_validator(mode="after")
    def _archive(self) -> FileSpec:
        if self.extract and archive_suffix(self.filename) is None:
            raise ValueError(
                f"extract: true needs an archive filename ending in one of "
                f"{', '.join(ARCHIVE_SUFFIXES)}; got {self.filename!r}"
            )
        if self.extract_to is not None and not self.extract:
            raise ValueError("extract_to is only meaningful with extract: true")
        if self.extract and self.target == self.filename:
            raise ValueError(f"extract_to must differ from filename {self.filename!r}")
        if self.members and (not self.extract or archive_suffix(self.filename) == ".gz"):
            raise ValueError("members need an archive that unpacks to a folder (extract: true, "
                             "not .gz)")
        paths = [m.path for m in self.members]
        if len(set(paths)) != len(paths):
            raise ValueError(f"members of {self.filename!r} list a path twice")
        return self

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
        suffix = archive_suffix(self.filename) or ""
        return self.filename[: len(self.filename) - len(suffix)]


class Manifest(BaseModel):
    """A dataset manifest (``raylf/data/manifests/<name>.yaml``)."""

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
                if produced in names:
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

    @property
    def hosts(self) -> list[str]:
        """The hosts the files are downloaded from (primary URLs, not mirrors), in file order."""
        hosts = (urllib.parse.urlsplit(f.url).netloc or f.url for f in self.files)
        return list(dict.fromkeys(hosts))


def manifest_folder() -> Traversable:
    """The folder of the manifests shipped in the installed package."""
    return resources.files("raylf.data") / "manifests"


def manifest_names() -> list[str]:
    """The names of the shipped manifests, sorted."""
    folder = manifest_folder()
    if not folder.is_dir():
        return []
    stems = (entry.name.removesuffix(".yaml") for entry in folder.iterdir()
             if entry.name.endswith(".yaml"))
    return sorted(stem for stem in stems if _NAME_RE.match(stem))


def load_manifest(name: str) -> Manifest:
    """Read and validate the shipped manifest ``<name>.yaml``."""
    folder = manifest_folder()
    path = folder / f"{name}.yaml"
    if not _NAME_RE.match(name or "") or not path.is_file():
        known = manifest_names()
        listing = ", ".join(known) if known else f"(none found in {folder})"
        raise DatasetError(
            f"unknown dataset {name!r}: no manifest {path}. Known datasets: {listing}"
        )
    return _read_manifest(path, name)


def list_manifests() -> list[Manifest]:
    """Every shipped manifest, sorted by name."""
    folder = manifest_folder()
    return [_read_manifest(folder / f"{name}.yaml", name) for name in manifest_names()]


def _read_manifest(path: Traversable, name: str) -> Manifest:
    """Read one manifest; every error names the file, what is wrong in it and how to repair it."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise DatasetError(f"cannot read manifest {path}: {' '.join(str(exc).split())}; "
                           f"{_repair(name)}") from exc
    if not isinstance(raw, dict):
        raise DatasetError(f"manifest {path} must be a mapping, got {type(raw).__name__}; "
                           f"{_repair(name)}")
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}"
                             for e in exc.errors())
        raise DatasetError(f"invalid manifest {path}: {problems}; {_repair(name)}") from exc
    if manifest.name != name:
        raise DatasetError(f"manifest {path} declares name {manifest.name!r}; must be {name!r}; "
                           f"{_repair(name)}")
    return manifest


def _repair(name: str) -> str:
    return (f"fix it, or restore the file raylf ships (git checkout -- "
            f"raylf/data/manifests/{name}.yaml in a checkout, else pip install --force-reinstall "
            "--no-deps raylf)")
