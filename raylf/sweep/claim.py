"""A sweep directory's claim (``sweep.json``): which trials (and searches) it holds, so that a
directory resumes only the sweep that created it (Tune's space is fixed), and a directory that
holds anything else is not taken for one."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from raylf import results
from raylf.errors import SpecError
from raylf.sweep.lease import FOLDER as LEASE_FOLDER
from raylf.sweep.spec import SearchedMethod, SweepSpec, Trial
from raylf.sweep.writable import PROBE, unusable


def sweep_identity(sweep: SweepSpec, trials: list[Trial],
                   searches: list[SearchedMethod]) -> dict[str, Any]:
    """What a resumed sweep directory must hold the same: its trials, and for a search sweep
    every search and what is replicated."""
    identity: dict[str, Any] = {"trial_ids": sorted(t.trial_id for t in trials)}
    if searches:
        identity.update(searches=[p.identity() for p in searches], seeds=sweep.seeds,
                        top_k=sweep.top_k)
    return identity


def _sweep_marker(path: str):
    fs, base = results.filesystem(path)
    return fs, f"{base}/sweep.json"


def claimed(path: str) -> bool:
    """Whether ``path`` holds a sweep's claim. The first read of the storage, before anything
    starts: a storage that refuses it (credentials that may not even look up an object) is a
    spec error naming ``--storage``."""
    import pyarrow.fs as pafs

    fs, marker = _sweep_marker(path)
    try:
        return fs.get_file_info(marker).type == pafs.FileType.File
    except OSError as err:
        raise unusable(f"read {path}/sweep.json", err) from None


def identity_hash(identity: dict[str, Any]) -> str:
    """A short name of a sweep's identity: what its lease records (raylf.sweep.lease)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]


def check_same_sweep(path: str, identity: dict[str, Any], force: bool = False) -> None:
    """A sweep directory resumes only the sweep that created it (Tune's space is fixed); a
    directory that holds something but no sweep's claim is used only with ``force``."""
    if not claimed(path):
        if not force:
            _refuse_foreign(path)
        return
    fs, marker = _sweep_marker(path)
    with fs.open_input_stream(marker) as f:
        before = json.loads(f.read())
    if before != identity:
        old, new = before.get("trial_ids", []), identity["trial_ids"]
        what = "searches" if before.get("searches") != identity.get("searches") else "trials"
        raise SpecError([("name", (
            f"{path} holds a different sweep ({len(old)} trials, "
            f"{len(set(old) - set(new))} of them not in this spec; its {what} differ); choose "
            "another --name or --storage, or remove that directory"))])


def _refuse_foreign(path: str) -> None:
    """A non-empty directory without ``sweep.json`` is not a sweep's (a lease or a write probe
    left by a driver that died before claiming it aside): Tune's state and the tables would
    mix with whatever it holds."""
    import pyarrow.fs as pafs

    fs, base = results.filesystem(path)
    try:
        found = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    except OSError as err:
        raise unusable(f"read {path}", err) from None
    names = sorted(i.base_name for i in found
                   if i.base_name != LEASE_FOLDER and not i.base_name.startswith(PROBE))
    if names:
        shown = ", ".join(names[:3]) + (", …" if len(names) > 3 else "")
        raise SpecError([("--storage", (
            f"{path} is not empty ({len(names)} entries: {shown}) and holds no sweep.json, so "
            "it is no raylf sweep's directory; choose another --name or --storage, or pass "
            "--force to run the sweep in it all the same"))])


def claim(path: str, identity: dict[str, Any]) -> None:
    """Record which trials (and searches) this sweep directory holds (kept on resume)."""
    if claimed(path):
        return
    fs, marker = _sweep_marker(path)
    with fs.open_output_stream(marker) as f:
        f.write(json.dumps(identity).encode())
