"""The dataset cache: where fetched datasets live, when one counts as complete, and fetching one.

:func:`fetch` downloads a manifest's files into the cache, verifies them and unpacks archives;
:func:`require` is what data sources call: it returns the dataset folder when a completed fetch is
recorded there, and otherwise raises :class:`DatasetMissing` saying exactly how to get the data.
:func:`read_verified` is how a source reads a file an archive unpacked when the manifest publishes
its digest: the bytes come back only once they hash to it.

Cache layout (``DIR`` = :func:`data_root`)::

    DIR/<name>/<filename>          every downloaded file, verified (archives are kept)
    DIR/<name>/<extract_to>/       what an archive unpacked to (default: filename minus suffix)
    DIR/<name>/.complete           completion marker, JSON, written last
    DIR/.<name>.lock               serializes concurrent fetches of one dataset

The marker is written last, so its presence means "complete"; fetching a complete dataset again
is a no-op that touches no network. Data without a published digest are refused unless the caller
passes ``allow_unverified=True``.

The marker also records the data's origin: ``real`` (a download verified against the shipped
manifest; markers without the field are real) or ``standin`` (random content in the real format,
written by :mod:`raylf.data.standin` through this same fetch). A stand-in is checked against the
digests its own marker records, since the shipped manifest describes the real files; a real fetch
into a folder holding a stand-in removes it first, so no stand-in file is ever taken for a real
one (files without a published digest would otherwise be reused as they are).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from raylf.data import atomic_files
from raylf.data.download import check_digests, hash_file, obtain
from raylf.data.extract import extract
from raylf.data.manifest import DatasetError, FileSpec, Manifest, load_manifest

try:  # POSIX only; on other platforms concurrent fetches are simply not serialized
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

MARKER = ".complete"
MARKER_VERSION = 1
ENV_VAR = "RAYLF_DATA"
FETCH_COMMAND = "python -m raylf.datasets fetch"
STANDIN_COMMAND = "python -m raylf.datasets standin"
REAL, STANDIN = "real", "standin"  # the origins a marker records
_TIMEOUT_S = 60.0


class DatasetMissing(DatasetError):
    """The dataset is not (completely) present in the cache; the message says how to fetch it."""


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


def standin_root(root: str | os.PathLike[str] | None = None) -> Path:
    """Where stand-ins go by default: ``standin/`` inside the cache root ``data_root(root)``, a
    root of its own, so a stand-in never sits where the real dataset is looked for (a spec
    reads it only by naming this folder as ``dataset.root``)."""
    return data_root(root) / "standin"


def is_complete(
    name: str, root: str | os.PathLike[str] | None = None, manifest: Manifest | None = None
) -> bool:
    """True when ``name`` is complete under the cache root, as real data or as a stand-in
    (:func:`dataset_origin` tells which)."""
    return dataset_origin(name, root, manifest) is not None


def dataset_origin(
    name: str, root: str | os.PathLike[str] | None = None, manifest: Manifest | None = None
) -> str | None:
    """``"real"`` or ``"standin"`` when ``name`` is complete under the cache root, else None."""
    state = _state(data_root(root) / name, _resolve_manifest(name, manifest))
    return state[0] if state else None


def require(
    name: str, root: str | os.PathLike[str] | None = None, manifest: Manifest | None = None
) -> Path:
    """The dataset folder if a complete fetch is recorded there; else :class:`DatasetMissing`
    with the fetch command and the files to place by hand."""
    return locate(name, root, manifest)[0]


def locate(
    name: str, root: str | os.PathLike[str] | None = None, manifest: Manifest | None = None
) -> tuple[Path, str]:
    """The dataset folder and its origin (``"real"`` / ``"standin"``), as :func:`require`."""
    manifest = _resolve_manifest(name, manifest)
    base = data_root(root)
    folder = base / name
    state = _state(folder, manifest)
    if state is not None:
        return folder, state[0]
    raise DatasetMissing(_missing_message(name, manifest, base, folder))


def fetch(
    name: str,
    root: str | os.PathLike[str] | None = None,
    manifest: Manifest | None = None,
    *,
    allow_unverified: bool = False,
    force: bool = False,
    timeout: float = _TIMEOUT_S,
    progress: bool = False,
    standin: dict[str, Any] | None = None,
) -> Path:
    """Download, verify and unpack ``name`` into ``data_root(root)/name``; return that folder.

    A dataset whose completion marker matches the manifest is returned at once (no network).
    Files already present under their final name are verified and reused (manual placement,
    resumed fetches). ``force`` discards the marker and re-verifies every file. Files without a
    published digest are refused unless ``allow_unverified``. A stand-in in the folder is
    removed first: it is never complete data for a real fetch, and none of its files is reused.

    ``standin`` is for :mod:`raylf.data.standin` only: ``manifest`` then describes stand-in files
    (their own digests) and the marker records origin ``standin`` with this mapping (seed, size).
    """
    manifest = _resolve_manifest(name, manifest)
    base = data_root(root)
    folder = base / name
    origin = REAL if standin is None else STANDIN
    if not force and _complete_as(folder, manifest, origin):
        return folder

    unverified = [f.filename for f in manifest.files if not f.verified]
    if unverified and not allow_unverified:
        raise DatasetError(
            f"dataset {name!r}: no published digest for {', '.join(unverified)}, so a download "
            f"cannot be verified; refusing. Add sha256/md5 to raylf/data/manifests/{name}.yaml "
            f"from a source you trust, or accept the data unverified with allow_unverified=True "
            f"(CLI: --allow-unverified)."
            + (f" Note: {manifest.note.strip()}" if manifest.note else "")
        )

    base.mkdir(parents=True, exist_ok=True)
    with lock(base, name):
        if not force and _complete_as(folder, manifest, origin):  # another process finished it
            return folder
        if (read_marker(folder) or {}).get("origin") == STANDIN:
            shutil.rmtree(folder)  # nothing of a stand-in may pass for real (or other) data
        folder.mkdir(parents=True, exist_ok=True)
        atomic_files.remove_leftovers(folder)
        with contextlib.suppress(FileNotFoundError):
            (folder / MARKER).unlink()  # from here on the dataset reads as absent
        records = []
        try:
            for spec in manifest.files:
                digests = obtain(spec, folder, timeout=timeout, progress=progress, force=force)
                if spec.extract:
                    extract(spec, folder)
                records.append(
                    {
                        "filename": spec.filename,
                        "url": spec.url,
                        "size": (folder / spec.filename).stat().st_size,
                        "verified": spec.verified,
                        "extracted_to": spec.target,
                        **digests,
                        "members": [{"path": m.path, **m.digests} for m in spec.members],
                    }
                )
        except BaseException:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only succeeds when nothing (verified) was kept
            raise
        marker = {
            "version": MARKER_VERSION,
            "name": name,
            "origin": origin,
            **({} if standin is None else {"standin": standin}),
            "verified": manifest.verified,
            "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": records,
        }
        atomic_files.write_text(folder / MARKER, json.dumps(marker, indent=2) + "\n")
    return folder


def verify(
    name: str, root: str | os.PathLike[str] | None = None, manifest: Manifest | None = None
) -> Path:
    """Re-hash every kept file of a fetched dataset, and every unpacked file the manifest lists,
    against the manifest (a stand-in: against the digests its marker records; slow, thorough)."""
    folder = require(name, root, manifest)
    manifest = _fetched_against(folder, _resolve_manifest(name, manifest))
    fix = repair_command(name, folder)
    for spec in manifest.files:
        checked = [(spec, folder / spec.filename)] if spec.verified else []
        checked += [(member, folder / (spec.target or "") / member.path)
                    for member in spec.members]
        for digested, path in checked:
            if not path.is_file():
                raise DatasetError(f"{path} is missing; {fix}")
            check_digests(digested, hash_file(path, digested.digests), str(path), fix)
    return folder


def read_verified(folder: Path, relative: str, manifest: Manifest | None = None) -> bytes:
    """The bytes of ``folder/relative``, a file an archive of the dataset in ``folder`` (a
    dataset folder of the cache) unpacked, once they hash to the digest its manifest publishes.

    The bytes hashed are the bytes returned, so nothing can swap the file between check and
    use; that matters for pickled data, which runs code as it loads. A file the manifest gives
    no digest for is refused, as is a missing or mismatching one (with the command that
    repairs the cache). A stand-in's files are checked against the digests its marker records
    when it was written, so the check runs for stand-ins too.
    """
    name = folder.name
    manifest = _fetched_against(folder, _resolve_manifest(name, manifest))
    members = {f"{spec.target}/{member.path}": member
               for spec in manifest.files for member in spec.members}
    if relative not in members:
        raise DatasetError(f"{folder / relative}: the manifest of {name!r} publishes no digest "
                           "for it, so it is not read")
    path = folder / relative
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc}; {repair_command(name, folder)}") from exc
    member = members[relative]
    actual = {alg: hashlib.new(alg, data).hexdigest() for alg in member.digests}
    check_digests(member, actual, str(path), f"it was not read; {repair_command(name, folder)}")
    return data


def repair_command(name: str, folder: Path) -> str:
    """What rewrites the dataset ``name`` in its cache folder ``folder``: the fetch, or for a
    stand-in its writer."""
    if (read_marker(folder) or {}).get("origin") == STANDIN:
        return f"write the stand-in again with: {STANDIN_COMMAND} {name} --root {folder.parent}"
    return f"repair the cache with: {FETCH_COMMAND} {name} --force --root {folder.parent}"


def _resolve_manifest(name: str, manifest: Manifest | None) -> Manifest:
    if manifest is None:
        return load_manifest(name)
    if manifest.name != name:
        raise DatasetError(f"manifest is for {manifest.name!r}, not {name!r}")
    return manifest


def _complete_as(folder: Path, manifest: Manifest, origin: str) -> bool:
    state = _state(folder, manifest)
    return state is not None and state[0] == origin


def _state(folder: Path, manifest: Manifest) -> tuple[str, Manifest] | None:
    """(origin, the manifest the data in ``folder`` answer to) when a complete fetch is recorded
    there, else None."""
    data = read_marker(folder)
    if data is None or data.get("name") != manifest.name:
        return None
    origin = data.get("origin", REAL)
    if origin == STANDIN:
        manifest = _standin_manifest(manifest, data)
    elif origin != REAL:
        return None
    if manifest is None or not _marker_matches(folder, manifest, data):
        return None
    return origin, manifest


def _fetched_against(folder: Path, manifest: Manifest) -> Manifest:
    """The manifest whose digests the data in ``folder`` must have: ``manifest`` for real data,
    the stand-in's own for a stand-in; a folder without a complete fetch is an error."""
    state = _state(folder, manifest)
    if state is None:
        raise DatasetError(f"{folder} holds no complete fetch of {manifest.name!r}; "
                           f"{repair_command(manifest.name, folder)}")
    return state[1]


def _standin_manifest(shipped: Manifest, data: dict[str, Any]) -> Manifest | None:
    """``shipped`` with the files, sizes and digests a stand-in's marker records; None when the
    marker lacks a file or lists other archive members than the real archive has."""
    recorded = {f.get("filename"): f for f in data.get("files", []) if isinstance(f, dict)}
    files = []
    try:
        for spec in shipped.files:
            entry = recorded[spec.filename]
            members = entry["members"]
            if sorted(m["path"] for m in members) != sorted(m.path for m in spec.members):
                return None
            files.append(FileSpec.model_validate({
                **spec.model_dump(), "url": entry["url"], "mirrors": [], "size": entry["size"],
                "sha256": entry["sha256"], "md5": None, "members": members}))
    except (KeyError, TypeError, ValueError):  # pydantic's ValidationError is a ValueError
        return None
    return shipped.model_copy(update={"files": files})


def _marker_matches(folder: Path, manifest: Manifest, data: dict[str, Any]) -> bool:
    """The marker ``data`` records every manifest file with the manifest's digests, and every
    recorded path is still there."""
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


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The completion marker of a dataset folder as a mapping, None when absent or unreadable."""
    try:
        data = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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
    lines.append(f"To check a spec without the real data: {STANDIN_COMMAND} {name} --root "
                 f"{standin_root(base)} writes a stand-in (random content, the real format) "
                 "there; set dataset.root to that folder to read it.")
    return "\n".join(lines)


@contextlib.contextmanager
def lock(base: Path, name: str) -> Iterator[None]:
    """An exclusive advisory lock on dataset ``name`` under the root ``base``, so concurrent
    fetches of one dataset (several Ray workers on one node) and stand-in writes do not
    interleave. No-op where fcntl is unavailable."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(base / f".{name}.lock", "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
