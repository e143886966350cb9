"""A sweep directory's claim (``sweep.json``): which trials (and searches) it holds, so that a
directory resumes only the sweep that created it (Tune's space is fixed)."""

from __future__ import annotations

import json
from typing import Any

from raylf import results
from raylf.errors import SpecError
from raylf.sweep.spec import SearchedMethod, SweepSpec, Trial
from raylf.sweep.writable import unusable


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


def check_same_sweep(path: str, identity: dict[str, Any]) -> None:
    """A sweep directory resumes only the sweep that created it (Tune's space is fixed)."""
    if not claimed(path):
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


def claim(path: str, identity: dict[str, Any]) -> None:
    """Record which trials (and searches) this sweep directory holds (kept on resume)."""
    if claimed(path):
        return
    fs, marker = _sweep_marker(path)
    with fs.open_output_stream(marker) as f:
        f.write(json.dumps(identity).encode())
