"""Arrow result tables: one Parquet file per trial and table, written atomically.

Layout: ``<root>/tables/{trials,rounds,clients}/<trial_id>.parquet``. ``root`` is a local path or
any URI pyarrow's filesystem layer understands (``s3://…``; :mod:`raylf.storage`), so the same
code writes to a laptop disk, NFS or object storage. A re-run trial overwrites its own files,
never another's. Once a sweep is done it compacts each table into one file (:func:`compact`),
which readers then read instead of a file a trial.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

import raylf
from raylf.storage import filesystem, publish

TABLES = ("trials", "rounds", "clients")
COMPACT = "compact"
FINGERPRINT = "fingerprint"  # compacted metadata: the per-trial files compacted (_fingerprint)
READERS = 8  # per-trial files read at once
BATCH = 500  # per-trial files joined at once

_FLOAT = pa.float64()
_INT = pa.int64()
_STR = pa.string()
STATUSES = ("ok", "diverged", "failed", "timeout")  # how a trial ends (the trials table's status)
# The status of the row a sweep trial's attempt writes before it runs: the row its end writes
# replaces it, so one left behind is an attempt that never ended (its process or the driver was
# killed, or the sweep is still running it). It counts the attempts.
STARTED = "started"
COLUMN_TYPES: dict[str, pa.DataType] = {
    "trial_id": _STR, "sweep": _STR, "method": _STR, "dataset": _STR, "scenario": _STR,
    "model": _STR, "seed": _INT, "status": _STR, "error": _STR, "backend": _STR,
    "round": _INT, "rounds": _INT, "diverged_round": _INT, "best_round": _INT,
    "participants": _INT, "bytes_up": _INT, "bytes_down": _INT, "wall_s": _FLOAT,
    "round_s": _FLOAT, "loss": _FLOAT, "eval_loss": _FLOAT, "acc_mean": _FLOAT,
    "acc_weighted": _FLOAT, "acc_worst": _FLOAT, "acc_bottom20": _FLOAT, "acc_gap": _FLOAT,
    "best_acc_mean": _FLOAT, "client_id": _INT, "group": _INT, "n_train": _INT, "n_test": _INT,
    "task": _STR, "split": _STR, "deployable": _STR, "best_val_round": _INT,
    "best_val_acc_mean": _FLOAT, "acc_mean_at_best_val": _FLOAT, "correct": _INT,
    "accuracy": _FLOAT, "auc": _FLOAT,
    # whether a run learns (raylf.learning_check)
    "warning": _STR, "majority_rate": _FLOAT, "dead_relu_fraction": _FLOAT,
    # the input normalization applied (raylf.data.normalize): JSON per-channel lists, origin
    "normalize": _STR, "normalize_mean": _STR, "normalize_std": _STR, "normalize_from": _STR,
    # where the data come from (SourceData.origin: real, standin, bundled, generated, user)
    "data_origin": _STR,
    # what federation.rounds counts: "round", or "step" for the per-step methods
    "round_unit": _STR,
    # the method's traits a report needs without importing it (raylf.methods.base.Method):
    # a reference that reads the latent groups, and the paper that proposes the method
    "oracle": pa.bool_(), "proposed_in": _STR,
}


@cache
def _git() -> tuple[str, bool | None]:
    """The checkout raylf is imported from: HEAD's sha and whether tracked files differ from
    it ("unknown" and None outside a git checkout, e.g. an installed wheel or a Ray job's
    working directory without ``.git``)."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], capture_output=True, text=True,
                                 cwd=Path(__file__).parent, timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout if out.returncode == 0 else None

    sha = (git("rev-parse", "HEAD") or "").strip()
    if not sha:
        return "unknown", None
    status = git("status", "--porcelain", "--untracked-files=no")
    return sha, None if status is None else bool(status.strip())


@cache
def environment() -> dict[str, Any]:
    """The software a trial ran with, as its trials row (``env.*``) and every table's Parquet
    metadata record it: two results that differ here are not the same experiment even when
    their specs are (``python -m raylf.report A B --diff``). The training device is added by
    the run (``env.device``), which alone knows where its clients trained."""
    import platform

    import numpy
    import ray
    import torch

    sha, dirty = _git()
    return {"raylf": raylf.__version__, "git_sha": sha, "git_dirty": dirty,
            "python": platform.python_version(), "torch": torch.__version__,
            "ray": ray.__version__, "numpy": numpy.__version__,
            "cuda": torch.version.cuda or "none"}


def provenance(config: dict[str, Any], env: dict[str, Any] | None = None) -> dict[str, str]:
    """Parquet schema metadata: the versions at a glance, the ``config`` that ran (a resolved
    spec: ``ExperimentSpec.resolved``) and the ``environment`` as JSON."""
    env = {**environment(), **(env or {})}
    return {"raylf": env["raylf"], "ray": env["ray"], "torch": env["torch"],
            "git_sha": env["git_sha"], "config": json.dumps(config, sort_keys=True),
            "environment": json.dumps(env, sort_keys=True)}


def to_table(rows: list[dict[str, Any]], metadata: dict[str, str]) -> pa.Table:
    """Rows to Arrow with the declared column types (so all-null columns stay numeric). No rows
    (a diverged trial's clients) still give a ``trial_id`` column: readers such as duckdb refuse
    a Parquet file without columns."""
    columns: dict[str, None] = {} if rows else {"trial_id": None}
    for row in rows:
        columns.update(dict.fromkeys(row))
    arrays, fields = [], []
    for name in columns:
        values = [row.get(name) for row in rows]
        declared = COLUMN_TYPES.get(name)
        array = pa.array(values, type=declared) if declared else pa.array(values)
        if pa.types.is_null(array.type):
            array = array.cast(_FLOAT)
        arrays.append(array)
        fields.append(pa.field(name, array.type))
    schema = pa.schema(fields, metadata={k: v for k, v in metadata.items()})
    return pa.Table.from_arrays(arrays, schema=schema)


def write_table(root: str | Path, table_name: str, trial_id: str, table: pa.Table) -> str:
    """Serialize in memory, then publish whole: readers never see half a file (``publish``
    makes the folder where the storage has folders)."""
    fs, base = filesystem(root)
    final = f"{base}/tables/{table_name}/{trial_id}.parquet"
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer)
    publish(fs, final, buffer.getvalue())
    return final


def write_trial(root: str | Path, trial_id: str, tables: dict[str, list[dict[str, Any]]],
                config: dict[str, Any], env: dict[str, Any] | None = None) -> dict[str, str]:
    """Every table of the trial, its trials row last: a trial is complete once that exists."""
    meta = provenance(config, env)
    order = [n for n in tables if n != "trials"] + ["trials"]
    return {name: write_table(root, name, trial_id, to_table(tables[name] or [], meta))
            for name in order}


def table_names(root: str | Path) -> list[str]:
    """The three tables, then every method-defined table found under ``root``."""
    fs, base = filesystem(root)
    selector = pafs.FileSelector(f"{base}/tables", allow_not_found=True)
    found = sorted(i.base_name for i in fs.get_file_info(selector)
                   if i.type == pafs.FileType.Directory and i.base_name not in TABLES)
    return [*TABLES, *found]


def delete_trial(root: str | Path, trial_id: str) -> None:
    fs, base = filesystem(root)
    for name in table_names(root):
        path = f"{base}/tables/{name}/{trial_id}.parquet"
        if fs.get_file_info(path).type == pafs.FileType.File:
            fs.delete_file(path)


def read_trial(root: str | Path, trial_id: str) -> dict[str, Any] | None:
    """The trials-table row one trial wrote, or None if it has not finished writing."""
    fs, base = filesystem(root)
    try:
        rows = _read_file(fs, f"{base}/tables/trials/{trial_id}.parquet").to_pylist()
    except FileNotFoundError:
        return None
    return rows[0] if rows else None


def read_table(root: str | Path, table_name: str) -> pa.Table | None:
    """The table's rows from every trial's file, or from its compacted file (:func:`compact`)
    while that holds exactly the per-trial files there now: one read instead of one a trial
    once a sweep is done, and the live files while trials still write."""
    fs, base = filesystem(root)
    files = _trial_files(fs, base, table_name)
    if not files:
        return None
    compacted = f"{base}/{COMPACT}/tables/{table_name}/{table_name}.parquet"
    if fs.get_file_info(compacted).type == pafs.FileType.File:
        meta = pq.read_schema(compacted, filesystem=fs).metadata or {}
        if meta.get(FINGERPRINT.encode()) == _fingerprint(files).encode():
            return pq.read_table(compacted, filesystem=fs)
    return _read_files(fs, files)


def written_trials(root: str | Path, table_name: str) -> set[str]:
    """The trials whose file of ``table_name`` is in place (one listing)."""
    fs, base = filesystem(root)
    return {info.base_name.removesuffix(".parquet") for info in _trial_files(fs, base, table_name)}


def _trial_files(fs: pafs.FileSystem, base: str, table_name: str) -> list[pafs.FileInfo]:
    selector = pafs.FileSelector(f"{base}/tables/{table_name}", allow_not_found=True)
    return sorted((i for i in fs.get_file_info(selector)
                   if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")),
                  key=lambda i: i.path)


def _fingerprint(files: list[pafs.FileInfo]) -> str:
    """What a table's per-trial files were: their names, sizes and modification times."""
    digest = hashlib.sha256()
    for info in files:
        digest.update(f"{info.base_name}\0{info.size}\0{info.mtime_ns}\n".encode())
    return digest.hexdigest()


def _read_files(fs: pafs.FileSystem, files: list[pafs.FileInfo]) -> pa.Table:
    """The per-trial files as one table, read a few at a time (an object store answers each
    read after a round trip) and joined a batch at a time: a sweep's thousands of one-trial
    tables, each with its own schema and metadata, held at once took 850 MB for 10,000
    trials' three tables whose rows take a few."""
    with ThreadPoolExecutor(READERS) as pool:
        return _joined([_joined(list(pool.map(lambda info: _read_file(fs, info.path),
                                              files[start:start + BATCH])))
                        for start in range(0, len(files), BATCH)])


def _read_file(fs: pafs.FileSystem, path: str) -> pa.Table:
    """One Parquet file, read directly: half the time of ``pq.read_table``'s dataset layer on
    a one-trial file, which a sweep pays per trial and file."""
    with fs.open_input_file(path) as source:
        return pq.ParquetFile(source).read()


def _joined(parts: list[pa.Table]) -> pa.Table:
    """Tables with columns unioned by name, one chunk a column: each of a sweep's thousands of
    per-trial chunks would otherwise cost every later take or filter a step (pandas on Arrow
    columns: a row lookup per trial made the report grow with the square of the trials)."""
    return pa.concat_tables(_retyped_nulls(parts), promote_options="permissive").combine_chunks()


def _retyped_nulls(parts: list[pa.Table]) -> list[pa.Table]:
    """A column that is all null in one trial's file was written as float (:func:`to_table`);
    where another trial's file has it as text (``model.weights``: null in one trial, a path in
    the next), the null column takes that type, so the files concatenate. A column whose values
    are text in one file and numbers in another (``model.hidden``: an MLP's list of widths, as
    JSON, beside a CharLSTM's width) is read as text in every file."""
    kinds: dict[str, set[pa.DataType]] = {}
    for part in parts:
        for field in part.schema:
            if part.column(field.name).null_count < len(part) or not len(part):
                kinds.setdefault(field.name, set()).add(field.type)
    text = {name for name, types in kinds.items()
            if any(pa.types.is_string(t) for t in types) and len(types) > 1}
    out = []
    for part in parts:
        for i, field in enumerate(part.schema):
            others = kinds.get(field.name, set()) - {field.type}
            if field.name in text:
                part = part.set_column(i, pa.field(field.name, pa.string()),
                                       part.column(i).cast(pa.string()))
            elif len(others) == 1 and part.column(i).null_count == len(part) and len(part):
                part = part.set_column(i, pa.field(field.name, next(iter(others))),
                                       pa.nulls(len(part), next(iter(others))))
        out.append(part)
    return out


def load(root: str | Path) -> dict[str, pd.DataFrame]:
    """All result tables under ``root`` as pandas DataFrames keyed trials / rounds / clients
    (always present) and by the name of every method-defined table (SP-CACW's ``alpha``)."""
    out = {}
    for name in table_names(root):
        table = read_table(root, name)
        out[name] = table.to_pandas() if table is not None else pd.DataFrame()
    return out


def compact(root: str | Path, names: list[str] | None = None) -> dict[str, str]:
    """One Parquet file per table with the union schema of its per-trial files, at
    ``<root>/compact/tables/<table>/<table>.parquet``: ``pl.read_parquet``,
    ``duckdb.read_parquet`` and ``pd.read_parquet`` open it without options (the per-trial files
    need a union by name, and duckdb refuses the column-less file of a trial without rows). The
    per-trial files stay, for crash safety and resume; ``compact/`` is a results root of its own
    (``load(root + "/compact")``), outside ``<root>/tables``, so nothing reading the per-trial
    files reads a row twice. Rewritten whole, each file atomically, on every call: a snapshot of
    the tables at that moment, which :func:`read_table` reads instead of the per-trial files
    for as long as they are what it was made from (its ``fingerprint``). ``names``: only these
    tables (default all). Returns the written paths by table."""
    written = {}
    fs, base = filesystem(root)
    for name in names or table_names(root):
        files = _trial_files(fs, base, name)
        if files:
            table = _read_files(fs, files).replace_schema_metadata(
                {"raylf": raylf.__version__, "compacted_from": f"tables/{name}/",
                 FINGERPRINT: _fingerprint(files)})
            written[name] = write_table(f"{str(root).rstrip('/')}/{COMPACT}", name, name, table)
    return written


def main(argv: list[str] | None = None) -> int:
    """``python -m raylf.results compact SWEEP_DIR``."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m raylf.results")
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("compact", help=compact.__doc__.split(":")[0])
    command.add_argument("sweep_dir", help="a sweep or experiment directory (path or URI)")
    args = parser.parse_args(argv)
    try:
        written = compact(args.sweep_dir)
    except (OSError, ValueError) as err:  # unreachable storage, a bad URI, clashing schemas
        print(f"error: cannot compact {args.sweep_dir}: {err}", file=sys.stderr)
        return 2
    if not written:
        print(f"error: no tables under {args.sweep_dir}/tables/", file=sys.stderr)
        return 2
    for name, path in written.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
