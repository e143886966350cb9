"""Whether the sweep's storage takes writes: probed before anything starts (a spec error) and
after a trial fails (a storage that stopped accepting writes fails every further trial the same
way, so the sweep stops instead)."""

from __future__ import annotations

import uuid

from raylf import results
from raylf.errors import SpecError

PROBE = ".raylf-write-probe-"  # the name of a probe's file begins so


class StorageUnwritable(RuntimeError):
    """The sweep's storage stopped accepting writes: every further trial would fail the same."""


def probe_storage(root: str) -> None:
    """Create the sweep directory and write (and remove) a file in it; OSError if it cannot."""
    fs, base = results.filesystem(root)
    probe = f"{base}/{PROBE}{uuid.uuid4().hex}"
    fs.create_dir(base, recursive=True)
    with fs.open_output_stream(probe) as f:
        f.write(b"ok")
    fs.delete_file(probe)


def unusable(what: str, err: OSError) -> SpecError:
    """The spec error of a storage that refused ``what`` (e.g. "write to s3://b/p")."""
    return SpecError([("--storage", (
        f"cannot {what}: {err}; choose a --storage you may read and write (a directory you "
        "own, or an s3:// bucket your credentials may get, list, put and delete objects in; "
        "for an endpoint other than AWS set AWS_ENDPOINT_URL)"))])


def check_storage(root: str) -> None:
    """The sweep directory can be written, before anything starts."""
    try:
        probe_storage(root)
    except OSError as err:
        raise unusable(f"write to {root}", err) from None
