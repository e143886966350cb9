"""Getting one manifest file into a dataset folder, verified.

A file reaches its final name only after its size and digests were checked: it is streamed to a
temporary file next to it and renamed. A wrong digest, a short download or a broken connection
raise :class:`DatasetError` (expected vs actual) and leave no file behind; an unreachable URL falls
through to the file's next mirror.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from raylf.data import atomic_files
from raylf.data.manifest import DatasetError, Digested, FileSpec

log = logging.getLogger(__name__)


class _NetworkError(Exception):
    """Transport-level failure (the next mirror may work); integrity failures are DatasetError."""


def obtain(
    spec: FileSpec, folder: Path, *, timeout: float, progress: bool, force: bool
) -> dict[str, str]:
    """Make ``folder/spec.filename`` exist and verified; return its digests (sha256 always).

    A file already there (placed by hand, or kept from an earlier fetch) is reused when it
    matches; a mismatching one is discarded and downloaded again, as is an unverified one under
    ``force``.
    """
    dest = folder / spec.filename
    wanted = {"sha256": "", **spec.digests}
    if dest.is_file():
        actual = hash_file(dest, wanted)
        try:
            _check_size(spec, dest.stat().st_size, None, str(dest))
            check_digests(spec, actual, str(dest))
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


def _download(
    url: str, spec: FileSpec, dest: Path, *, timeout: float, progress: bool
) -> dict[str, str]:
    fd, tmp = atomic_files.part_file(dest)
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
                    while chunk := response.read(atomic_files.CHUNK):
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
        check_digests(spec, actual, f"{spec.filename} from {url}")
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


_NOT_KEPT = ("the file was not kept; the download may be truncated or corrupted, or the source "
             "changed")


def check_digests(spec: Digested, actual: dict[str, str], what: str,
                  consequence: str = _NOT_KEPT) -> None:
    """Raise :class:`DatasetError` (expected vs actual, then ``consequence``: what became of the
    file and what to do) unless every published digest matches."""
    for alg, expected in spec.digests.items():
        if actual.get(alg) != expected:
            raise DatasetError(
                f"checksum mismatch for {what}: expected {alg} {expected}, "
                f"actual {alg} {actual.get(alg)} ({consequence})"
            )


def hash_file(path: Path, algorithms: Iterable[str]) -> dict[str, str]:
    """Hex digest of ``path`` for each algorithm, in one pass over the file."""
    hashers = {alg: hashlib.new(alg) for alg in algorithms}
    with path.open("rb") as fh:
        while chunk := fh.read(atomic_files.CHUNK):
            for h in hashers.values():
                h.update(chunk)
    return {alg: h.hexdigest() for alg, h in hashers.items()}
