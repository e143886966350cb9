"""The sweep lease: one driver at a time runs a sweep directory.

Two drivers in one directory would share Tune's state and the trials' checkpoints and publish
over each other's tables (a resubmitted ``ray job`` while the first still runs, or two sweeps
started at once under one name). A driver therefore holds the lease
``<sweep dir>/.lease/<generation>.json`` from before Ray starts until it exits: a record of the
sweep it runs (its identity's hash) and of itself (host, pid, process start time), renewed every
quarter of its expiry while the driver lives. A second driver finds the record live and exits 2
naming the holder and since when it runs.

Taking the lease is a single "create if absent", the one atomic operation these storages offer:
on a local or network disk a hard link of a complete file (which fails when the name exists), on
S3 a conditional put (``If-None-Match: *``, through boto3: pyarrow's filesystem has no
conditional write). A driver creates the generation after the last one it found, and only when
that one is free (released on exit) or stale: of two drivers that found it so, exactly one
creates the next, so two never hold the lease at once. Other object stores (``gs://``) have no
conditional put through pyarrow: there the create checks and then writes, which two drivers
started in the same instant can both pass (the CLI says so).

A record is stale when its driver cannot be running: on the same host, when no process with its
pid and start time runs (so a killed driver's lease is taken over at once); from another host,
when it was last renewed longer ago than the expiry it states (host clocks must agree to within
a small part of it). A driver whose lease was taken over all the same (it was suspended, or cut
off from the storage, for longer than the expiry) finds out at its next renewal and stops as
if interrupted.
"""

from __future__ import annotations

import _thread
import contextlib
import json
import math
import os
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import psutil
import pyarrow.fs as pafs

from raylf.errors import SpecError
from raylf.storage import filesystem

FOLDER = ".lease"
ENV_VAR = "RAYLF_LEASE_S"
# A driver on another host that died is replaced this long after its last renewal; renewals
# (every quarter of it) are one small write each, and a storage outage shorter than three of
# them loses nothing.
EXPIRY_S = 120.0
_ATTEMPTS = 5  # creates lost to other drivers before giving up


@dataclass(frozen=True)
class Holder:
    """A lease record: the sweep (its identity's hash) and the driver that holds the lease."""

    sweep: str
    host: str
    pid: int
    started: float  # the driver process's start, epoch seconds (with pid: which process)
    token: str  # this hold's own id: a renewal rewrites only a record that still carries it
    renewed: float  # epoch seconds
    expiry_s: float
    released: bool = False

    @classmethod
    def this_driver(cls, sweep: str, expiry_s: float, now: float) -> Holder:
        me = psutil.Process()
        return cls(sweep, socket.gethostname(), me.pid, me.create_time(), uuid.uuid4().hex,
                   now, expiry_s)

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, data: bytes | None) -> Holder | None:
        """The record in ``data``; None when there is none or it is not one (which nothing
        holds: every record is written whole)."""
        try:
            return cls(**json.loads(data)) if data else None
        except (ValueError, TypeError):
            return None

    def stale(self, now: float) -> bool:
        """Whether its driver cannot be running any more (see the module docstring)."""
        if self.released:
            return True
        if self.host == socket.gethostname():
            return not _running(self.pid, self.started)
        return now - self.renewed > self.expiry_s

    def describe(self, now: float, sweep: str) -> str:
        which = "this sweep" if self.sweep == sweep else f"another sweep, {self.sweep}"
        return (f"driver pid {self.pid} on host {self.host} ({which}), running since "
                f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(self.started))}, lease "
                f"renewed {max(0.0, now - self.renewed):.0f} s ago")


def _running(pid: int, started: float) -> bool:
    """Whether the process ``pid`` that started at ``started`` runs here (not a later process
    that was given the same pid, nor a zombie)."""
    try:
        process = psutil.Process(pid)
        return abs(process.create_time() - started) < 1.0 and \
            process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # there, but not ours to inspect: assume it is the driver
        return True


class LeaseHeld(SpecError):
    """A live driver holds the sweep directory's lease (exit 2)."""

    def __init__(self, root: str, holder: Holder, now: float, sweep: str):
        self.holder = holder
        super().__init__([("--storage", (
            f"{root} is in use by another sweep driver: {holder.describe(now, sweep)}. Wait "
            f"until it ends or stop it (ray job stop, or kill {holder.pid} on {holder.host}), "
            "then run this command again. A driver that died leaves a lease that is taken over "
            f"at once on its own host and from other hosts {holder.expiry_s:g} s after its "
            f"last renewal ({ENV_VAR})"))])


class _Store:
    """Where lease records live: ``generations()``, ``read``, ``create`` (if absent: False when
    the record exists), ``write``, ``delete``; ``atomic`` when ``create`` is."""

    atomic = True

    @staticmethod
    def record_name(generation: int) -> str:
        return f"{generation:08d}.json"

    @staticmethod
    def numbered(names: list[str]) -> list[int]:
        """The generations of the record names among ``names``, in order."""
        return sorted(int(n[:-5]) for n in names if re.fullmatch(r"\d+\.json", n))

    def remove_made(self) -> None:
        """Remove the folders the last create made (an object store has none)."""


class _LocalStore(_Store):
    """Lease records in a folder of a local or network disk."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.made: list[Path] = []  # the folders a create made, deepest first

    def _path(self, generation: int) -> Path:
        return self.folder / self.record_name(generation)

    def generations(self) -> list[int]:
        try:
            return self.numbered(os.listdir(self.folder))
        except FileNotFoundError:
            return []

    def read(self, generation: int) -> bytes | None:
        try:
            return self._path(generation).read_bytes()
        except FileNotFoundError:
            return None

    def _staged(self, data: bytes) -> Path:
        staged = self.folder / f".{uuid.uuid4().hex}.tmp"
        staged.write_bytes(data)
        return staged

    def create(self, generation: int, data: bytes) -> bool:
        self.made = [p for p in (self.folder, *self.folder.parents) if not p.exists()]
        self.folder.mkdir(parents=True, exist_ok=True)
        staged = self._staged(data)
        try:
            os.link(staged, self._path(generation))  # fails if the name exists: atomic
            return True
        except FileExistsError:
            return False
        finally:
            staged.unlink()

    def write(self, generation: int, data: bytes) -> None:
        os.replace(self._staged(data), self._path(generation))

    def delete(self, generation: int) -> None:
        self._path(generation).unlink(missing_ok=True)

    def remove_made(self) -> None:
        for folder in self.made:
            try:
                folder.rmdir()
            except OSError:
                return


class _S3Store(_Store):
    """Lease records under a prefix of an S3 bucket, through boto3 (conditional puts)."""

    def __init__(self, bucket: str, prefix: str, region: str | None):
        import boto3

        self.bucket, self.prefix = bucket, prefix
        # a session of its own: the default one keeps the credentials it first read
        self.client = boto3.session.Session().client("s3", region_name=region or None)

    def _key(self, generation: int) -> str:
        return f"{self.prefix}/{self.record_name(generation)}"

    @contextlib.contextmanager
    def _errors(self, what: str):
        """botocore's errors as the OSError every storage failure is (the CLI's spec error
        names --storage with it)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except (BotoCoreError, ClientError) as err:
            raise OSError(f"{what} s3://{self.bucket}/{self.prefix}: {err}") from err

    def generations(self) -> list[int]:
        names = []
        with self._errors("list"):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=f"{self.prefix}/")
            for page in pages:
                names += [item["Key"].rsplit("/", 1)[-1] for item in page.get("Contents", [])]
        return self.numbered(names)

    def read(self, generation: int) -> bytes | None:
        with self._errors("read"):
            try:
                return self.client.get_object(Bucket=self.bucket,
                                              Key=self._key(generation))["Body"].read()
            except self.client.exceptions.NoSuchKey:
                return None

    def create(self, generation: int, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        with self._errors("write to"):
            for _ in range(_ATTEMPTS):
                try:
                    self.client.put_object(Bucket=self.bucket, Key=self._key(generation),
                                           Body=data, IfNoneMatch="*")
                    return True
                except ClientError as err:
                    code = err.response.get("Error", {}).get("Code")
                    if code == "PreconditionFailed":  # the object exists
                        return False
                    if code != "ConditionalRequestConflict":  # S3: a concurrent put, retry
                        raise
            return False

    def write(self, generation: int, data: bytes) -> None:
        with self._errors("write to"):
            self.client.put_object(Bucket=self.bucket, Key=self._key(generation), Body=data)

    def delete(self, generation: int) -> None:
        with self._errors("delete in"):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(generation))


class _PyarrowStore(_Store):
    """Lease records on any other filesystem pyarrow opens (``gs://``): no conditional put, so
    a create checks and then writes (not atomic)."""

    atomic = False

    def __init__(self, fs: pafs.FileSystem, folder: str):
        self.fs, self.folder = fs, folder

    def _path(self, generation: int) -> str:
        return f"{self.folder}/{self.record_name(generation)}"

    def generations(self) -> list[int]:
        found = self.fs.get_file_info(pafs.FileSelector(self.folder, allow_not_found=True))
        return self.numbered([i.base_name for i in found])

    def read(self, generation: int) -> bytes | None:
        try:
            with self.fs.open_input_stream(self._path(generation)) as stream:
                return stream.read()
        except FileNotFoundError:
            return None

    def create(self, generation: int, data: bytes) -> bool:
        if self.fs.get_file_info(self._path(generation)).type != pafs.FileType.NotFound:
            return False
        self.fs.create_dir(self.folder, recursive=True)
        self.write(generation, data)
        return True

    def write(self, generation: int, data: bytes) -> None:
        with self.fs.open_output_stream(self._path(generation)) as out:
            out.write(data)

    def delete(self, generation: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self._path(generation))


def _store(root: str) -> _LocalStore | _S3Store | _PyarrowStore:
    fs, base = filesystem(root)
    if isinstance(fs, pafs.LocalFileSystem):
        return _LocalStore(Path(base) / FOLDER)
    if isinstance(fs, pafs.S3FileSystem):
        bucket, _, prefix = base.partition("/")
        return _S3Store(bucket, f"{prefix}/{FOLDER}".lstrip("/"), fs.region)
    return _PyarrowStore(fs, f"{base}/{FOLDER}")


def expiry_s() -> float:
    """The expiry this driver states in its record: ``$RAYLF_LEASE_S``, else :data:`EXPIRY_S`."""
    text = os.environ.get(ENV_VAR, "").strip()
    if not text:
        return EXPIRY_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise SpecError([(ENV_VAR, f"give the lease's expiry in seconds, a number > 0 (got "
                                   f"{text!r}), or unset it for {EXPIRY_S:g}")])
    return value


class Lease:
    """This driver's hold on a sweep directory, renewed by a daemon thread until released."""

    def __init__(self, root: str, store, generation: int, holder: Holder,
                 clock: Callable[[], float], on_lost: Callable[[], None]):
        self.root, self.store, self.generation, self.holder = root, store, generation, holder
        self.clock, self.on_lost = clock, on_lost
        self.atomic = store.atomic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="raylf-sweep-lease",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _ours(self) -> bool:
        """The last generation is ours and still carries our token."""
        if self.store.generations()[-1:] != [self.generation]:
            return False
        record = Holder.decode(self.store.read(self.generation))
        return record is not None and record.token == self.holder.token

    def renew(self) -> bool:
        """Rewrite our record as renewed now; False (nothing written) when the lease was taken
        over. OSError when the storage cannot be reached."""
        if not self._ours():
            return False
        self.holder = replace(self.holder, renewed=self.clock())
        self.store.write(self.generation, self.holder.encode())
        return True

    def _keep(self) -> None:
        while not self._stop.wait(self.holder.expiry_s / 4):
            try:
                held = self.renew()
            except OSError:  # an outage: the sweep reports it itself; the next turn retries
                continue
            if not held:
                print(f"error: another driver took over the lease of {self.root} (this one was "
                      f"not renewed for {self.holder.expiry_s:g} s); this driver stops",
                      file=sys.stderr, flush=True)
                self.on_lost()
                return

    def release(self, discard: bool = False) -> None:
        """Stop renewing and free the lease for the next driver at once: mark our record
        released, or with ``discard`` (nothing ran) remove it and the folders it made."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with contextlib.suppress(OSError):  # a record left behind goes stale with this process
            if not self._ours():
                return
            if discard:
                self.store.delete(self.generation)
                self.store.remove_made()
            else:
                self.store.write(self.generation, replace(self.holder, released=True).encode())

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(root: str, sweep: str, *, expiry: float | None = None,
            clock: Callable[[], float] = time.time,
            on_lost: Callable[[], None] = _thread.interrupt_main) -> tuple[Lease, Holder | None]:
    """Take the lease of the sweep directory ``root`` for this driver running ``sweep`` (its
    identity's hash) and renew it from now on. Returns the lease and the stale holder it took
    over from (None when the lease was free). :class:`LeaseHeld` when a live driver holds it;
    OSError when the storage refuses."""
    expiry = expiry_s() if expiry is None else expiry
    store = _store(root)
    for _ in range(_ATTEMPTS):
        found = store.generations()
        last = found[-1] if found else 0
        previous = Holder.decode(store.read(last)) if found else None
        now = clock()
        if previous is not None and not previous.stale(now):
            raise LeaseHeld(root, previous, now, sweep)
        me = Holder.this_driver(sweep, expiry, now)
        if store.create(last + 1, me.encode()):
            for old in found:  # generations before ours only tell a late renewal it lost
                with contextlib.suppress(OSError):
                    store.delete(old)
            lease = Lease(root, store, last + 1, me, clock, on_lost)
            lease.start()
            return lease, None if previous is None or previous.released else previous
    raise SpecError([("--storage", (
        f"{root}: other drivers took its lease {_ATTEMPTS} times while this one tried; run "
        "one driver per sweep"))])
