"""What a process tree writes under a local directory, counted by the kernel (inotify): every
file closed after writing and every file renamed into place, with its size, by kind.

A sweep's storage is written by the driver (Tune's experiment state, its trial logs, the
report), by the trial processes (tables, checkpoints) and by pyarrow's C++
code; counting at the kernel sees them all, rewrites included (Tune rewrites its experiment
state in place), which a listing at the end cannot. A file written in a hidden staging folder
and then renamed into place (``raylf.storage.publish``) counts once, as the rename: on an
object store it is one upload. The kernel merges an event with an identical one still queued:
the same file rewritten faster than the counter reads counts once (Tune rewrites its state
seconds apart).

Used by ``benchmarks/sweep_scaling.py``; Linux only.
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ISDIR = 0x40000000
_EVENT = struct.Struct("iIII")
_MASK = IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE


class StorageWrites:
    """Counts objects and bytes written under ``root`` by ``kind(relative_path)`` while running
    (``start`` … ``stop``). ``kind`` returns None for a path not to count (a staging file)."""

    def __init__(self, root: Path, kind: Callable[[str], str | None]):
        self.root = Path(root)
        self.kind = kind
        self.objects: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self.per_path: Counter[str] = Counter()  # writes of each relative path
        self.overflows = 0  # the kernel's queue overflowed: counts are a lower bound
        self.vanished = 0  # written files gone before they could be measured (bytes unknown)
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = -1
        self._dirs: dict[int, Path] = {}
        self._scanned: set[tuple[str, int, int]] = set()  # files a folder's scan counted
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> StorageWrites:
        self.root.mkdir(parents=True, exist_ok=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self._watch_tree(self.root)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        os.close(self._fd)

    def _watch_tree(self, folder: Path) -> None:
        """Watch ``folder`` and every folder below it; count the files already there (written
        before the watch could see them: a folder created and filled at once)."""
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(folder), _MASK)
        if wd < 0:  # removed meanwhile
            return
        self._dirs[wd] = folder
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                self._watch_tree(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                self._count(Path(entry.path), scanned=True)

    def _count(self, path: Path, scanned: bool = False) -> None:
        relative = path.relative_to(self.root).as_posix()
        kind = self.kind(relative)
        if kind is None:
            return
        try:
            stat = path.stat()
        except FileNotFoundError:
            self.vanished += 1
            self.objects[kind] += 1
            self.per_path[relative] += 1
            return
        key = (relative, stat.st_ino, stat.st_mtime_ns)
        if scanned:
            self._scanned.add(key)
        elif key in self._scanned:  # the scan of its new folder counted it already
            self._scanned.discard(key)
            return
        self.objects[kind] += 1
        self.bytes[kind] += stat.st_size
        self.per_path[relative] += 1

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self._fd], [], [], 0.2)
            if not ready:
                if self._stop.is_set():
                    return
                continue
            try:
                data = os.read(self._fd, 1 << 20)
            except BlockingIOError:
                continue
            offset = 0
            while offset < len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size: offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if mask & IN_Q_OVERFLOW:
                    self.overflows += 1
                    continue
                if mask & IN_IGNORED:
                    self._dirs.pop(wd, None)
                    continue
                folder = self._dirs.get(wd)
                if folder is None:
                    continue
                path = folder / os.fsdecode(name)
                if mask & IN_ISDIR:
                    if mask & (IN_CREATE | IN_MOVED_TO):
                        self._watch_tree(path)
                elif mask & (IN_CLOSE_WRITE | IN_MOVED_TO):
                    self._count(path)
