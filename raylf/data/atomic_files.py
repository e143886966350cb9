"""Crash-safe file operations of the dataset cache.

Everything is first written under a hidden temporary name in the folder it ends up in, then renamed
into place, so an interrupted fetch never leaves a partial file under a final name. Every
temporary name is made here, which lets :func:`remove_leftovers` recognise all of them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path

CHUNK = 1 << 20  # bytes per read when streaming, hashing or decompressing
_PART = ".part"
_EXTRACTING = ".extracting"
_OLD = ".old-"


def part_file(dest: Path) -> tuple[int, Path]:
    """An open descriptor and the path of a new temporary file that will become ``dest``."""
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=_PART, dir=dest.parent)
    return fd, Path(name)


def extracting_dir(dest: Path) -> Path:
    """A new temporary folder that an archive unpacks into before it becomes ``dest``."""
    return Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=_EXTRACTING, dir=dest.parent))


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see either the old file or all of the new."""
    fd, tmp = part_file(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def replace(src: Path, dst: Path) -> None:
    """Atomically put ``src`` at ``dst``; an existing ``dst`` is moved aside first and removed."""
    old: Path | None = None
    if dst.exists() or dst.is_symlink():
        old = dst.with_name(f".{dst.name}{_OLD}{os.getpid()}-{time.monotonic_ns()}")
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


def remove_leftovers(folder: Path) -> None:
    """Remove the temporaries of an interrupted fetch; the caller holds the fetch lock, so none
    of them is still in use."""
    for p in folder.iterdir():
        if p.name.startswith(".") and (p.name.endswith((_PART, _EXTRACTING)) or _OLD in p.name):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
