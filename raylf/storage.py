"""Where results live: a local directory or an object store (``s3://``, ``gs://``), both through
pyarrow.fs, as Ray Tune's own storage is.

An S3-compatible endpoint other than AWS (MinIO, Ceph, a test server) and its credentials come
from the environment every process reads: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION`` (pyarrow's S3 filesystem, Tune's and boto3 all take
them). Options in the URI's query string (``?endpoint_override=…``) are refused: raylf builds
every path by appending to the storage root, which would put them in the middle of the path.
So are credentials in the URI (``s3://KEY:SECRET@bucket``), which every message, Tune's state
and the report would repeat.
"""

from __future__ import annotations

import builtins
import logging
import traceback
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from raylf.errors import SpecError

_ENVIRONMENT = ("set the endpoint and credentials in the environment of every node: "
                "AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION")


def storage_root(root: str, flag: str = "--storage") -> str:
    """``root`` as every process must read it, checked before anything starts: a local path made
    absolute (Tune refuses a relative one, and other processes have other working directories),
    a URI without credentials or options (:func:`check_uri`)."""
    if "://" not in root:
        return str(Path(root).expanduser().resolve())
    check_uri(root, flag)
    return root


def check_uri(root: str, flag: str = "--storage") -> None:
    """Refuse a URI that carries credentials (``s3://KEY:SECRET@bucket``: they would be echoed
    in the console, error messages, Tune's state and the report, so the message withholds the
    whole authority) or options (``?endpoint_override=…``: raylf appends paths to the root,
    which would put them in the middle of the path)."""
    scheme, _, rest = root.partition("://")
    authority = rest.split("/", 1)[0]
    if "@" in authority or (":" in authority and scheme in ("s3", "gs", "gcs")):
        raise SpecError([(flag, (
            f"the {scheme}:// URI carries credentials before its bucket (user:secret@), which "
            "are refused and not printed here: give the bare URI (s3://bucket/prefix) and "
            + _ENVIRONMENT))])
    if "?" in root:
        raise SpecError([(flag, (
            f"{root} carries options in a query string, which raylf cannot append paths to; "
            "give the bare URI (s3://bucket/prefix) and " + _ENVIRONMENT))])


def filesystem(root: str | Path) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding ``root`` and ``root``'s path on it."""
    root = storage_root(str(root))
    if "://" not in root:
        return pafs.LocalFileSystem(), root
    return pafs.FileSystem.from_uri(root)


def create_folder(fs: pafs.FileSystem, path: str) -> None:
    """Create the folder ``path`` (and its parents) where folders exist. An object store has
    none: there pyarrow writes an empty marker object for every level of the path, on every
    call, which a sweep would pay per trial and table."""
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(path, recursive=True)


STAGING = ".staging"


def publish(fs: pafs.FileSystem, path: str, data: bytes | pa.Buffer) -> None:
    """Put ``data`` at ``path`` whole or not at all: readers (and a resumed sweep) never find a
    half-written file under the final name.

    A local disk gets a uniquely named file in the hidden ``.staging`` subfolder renamed into
    place. It is staged there, not beside the final name, because a listing of the folder reads
    the names and then stats each one: a file renamed away in between fails the whole listing
    (``FileNotFoundError`` naming the folder) for any reader of a live sweep. The stable
    subfolder is all such a listing sees, and readers (``read_table``, pyarrow's dataset
    discovery, which skips dot-names) pass over it. An object store needs no
    rename (it has none: pyarrow would copy and delete): an object becomes visible only when its
    upload completes, and a failed or killed upload leaves nothing. The bytes go in one write,
    so no error between two writes can close the upload with part of them."""
    if isinstance(fs, pafs.LocalFileSystem):
        folder, name = path.rsplit("/", 1)
        fs.create_dir(f"{folder}/{STAGING}", recursive=True)
        tmp = f"{folder}/{STAGING}/{name}.{uuid.uuid4().hex}.tmp"
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        fs.move(tmp, path)
        return
    with fs.open_output_stream(path) as out:
        out.write(data)


def trial_error(trial) -> str | None:
    """The error Tune recorded for a Tune trial's last failed attempt, from the driver's own
    copy. ``Trial.get_error()`` reads the copy in the storage, which Tune uploads later: a
    callback right after the failure may find none there, and while the storage is down the
    read raises (inside a Tune callback, that ends the whole sweep with Tune's traceback)."""
    path = trial.error_file
    return Path(path).read_text() if path is not None and Path(path).is_file() else None


# Ray's loggers that print a storage failure with a traceback: Tune's background upload, its
# experiment-state snapshot, its storage set-up, its report of a failed trial attempt, and its
# download of a retried trial's results.
RAY_STORAGE_LOGGERS = ("ray.train._internal.syncer", "ray.tune.execution.experiment_state",
                       "ray.train._internal.storage", "ray.tune.execution.tune_controller",
                       "ray.tune.logger.logger")


def _storage_error(text: str) -> str | None:
    """The last line of a traceback if it names a storage error: an OSError (what pyarrow.fs
    raises for a local disk and an object store alike) or the sweep's StorageUnwritable."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    name = lines[-1].partition(": ")[0].rsplit(".", 1)[-1]
    found = getattr(builtins, name, None)
    storage = isinstance(found, type) and issubclass(found, OSError)
    return lines[-1] if storage or name == "StorageUnwritable" else None


class OneLineStorageErrors(logging.Filter):
    """Shortens a record whose traceback ends in a storage error to its first line and that
    error. During an outage Tune logs every failed upload and trial attempt with a traceback of
    its own internals; the error's own line says all a user can act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        exc = record.exc_info[1] if record.exc_info else None
        error = _storage_error("".join(traceback.format_exception(exc)) if exc else message)
        if error is not None:
            first = message.strip().splitlines()[0].rstrip(": ") if message.strip() else ""
            record.msg = f"{first}: {error}" if first else error
            record.args, record.exc_info, record.exc_text = None, None, None
        return True


def one_line_storage_errors() -> None:
    """Put :class:`OneLineStorageErrors` on Ray's storage loggers in this process (the sweep's
    driver, where Tune runs); calling it again adds nothing."""
    for name in RAY_STORAGE_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, OneLineStorageErrors) for f in logger.filters):
            logger.addFilter(OneLineStorageErrors())
