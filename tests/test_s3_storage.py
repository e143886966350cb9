"""Sweeps with ``--storage s3://…`` against a real S3 API on loopback (the ``s3`` fixture: moto's
server with IAM checks, behind a relay the test takes down to stop the endpoint), driven as a
user's shell does: the endpoint and the credentials in the environment, nothing else."""

from __future__ import annotations

import io
import json
import logging
import re
import socket
import threading
import traceback

import pyarrow.fs as pafs
import pytest
import torch

from raylf import results, storage
from raylf.report.__main__ import main as report_main
from raylf.sweep import cli as sweep_cli
from tests.faults.helpers import (
    complete_trials,
    kill_group,
    listing,
    start_sweep,
    wait_for,
)
from tests.test_sweep import run_sweep, write_sweep

PLUGINS = {"RAYLF_PLUGINS": "tests.plugins.gates"}
ROUNDS = 3  # round 2 is checkpointed (the last round never is)
CLIENTS = 6  # tests.test_sweep.BASE


def test_a_query_string_in_storage_is_refused_naming_the_environment(tmp_path, capsys):
    spec = write_sweep(tmp_path)
    storage = "s3://bucket/sweeps?endpoint_override=127.0.0.1:1&scheme=http"
    assert sweep_cli.main([str(spec), "--storage", storage]) == 2
    err = capsys.readouterr().err
    assert "--storage:" in err and "AWS_ENDPOINT_URL" in err and "Traceback" not in err


def test_a_local_storage_path_is_made_absolute_before_anything_starts(tmp_path, monkeypatch):
    """Tune refuses a relative storage path (after Ray started and the sweep was claimed), and
    other processes have other working directories: ``--storage`` is resolved first."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert storage.storage_root("results/") == str(tmp_path / "results")
    assert storage.storage_root("~/results") == str(tmp_path / "home" / "results")
    assert storage.storage_root("s3://bucket/prefix") == "s3://bucket/prefix"


def test_a_table_folder_can_be_read_while_trials_publish_into_it(tmp_path):
    """The report on a live sweep lists ``tables/<table>/`` while trials finish. A listing reads
    the names and then stats each: a staged file renamed away in between failed the whole listing
    with ``FileNotFoundError`` naming the folder (seen in CI), so nothing is staged beside the
    final names. The writer publishes many files while the reader lists without pause."""
    fs, base = results.filesystem(tmp_path)
    folder = f"{base}/tables/trials"
    fs.create_dir(folder, recursive=True)
    errors: list[BaseException] = []
    writing = threading.Event()
    writing.set()

    def write_many():
        for i in range(400):
            storage.publish(fs, f"{folder}/t{i:04d}.parquet", b"x" * 64)
        writing.clear()

    writer = threading.Thread(target=write_many)
    writer.start()
    listings = 0
    while writing.is_set():
        try:
            fs.get_file_info(pafs.FileSelector(folder))
        except FileNotFoundError as err:
            errors.append(err)
        listings += 1
    writer.join()
    names = sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(folder)))
    assert not errors and listings > 1
    assert names == [storage.STAGING] + [f"t{i:04d}.parquet" for i in range(400)]


def test_ray_storage_errors_print_as_one_line_and_others_keep_their_traceback(tmp_path):
    """What the driver prints once ``one_line_storage_errors()`` ran (twice: still one filter):
    Tune's record of a failed upload shortened to its message and the storage error."""
    logger = logging.getLogger("ray.tune.execution.experiment_state")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    storage.one_line_storage_errors()
    storage.one_line_storage_errors()
    try:
        assert sum(isinstance(f, storage.OneLineStorageErrors) for f in logger.filters) == 1
        try:
            pafs.LocalFileSystem().open_input_stream(str(tmp_path / "missing"))
        except OSError:
            logger.error("Saving experiment state to storage at '%s' failed with exception: ",
                         "s3://b/p", exc_info=True)
            logger.warning(f"Last sync command failed with the following error:\n"
                           f"{traceback.format_exc()}")
        try:
            {}["key"]
        except KeyError:
            logger.error("Trial task failed for trial t", exc_info=True)
    finally:
        logger.removeHandler(handler)
        for name in storage.RAY_STORAGE_LOGGERS:
            for found in logging.getLogger(name).filters:
                if isinstance(found, storage.OneLineStorageErrors):
                    logging.getLogger(name).removeFilter(found)
    lines = stream.getvalue().splitlines()
    error = lines[0].removeprefix(
        "Saving experiment state to storage at 's3://b/p' failed with exception: ")
    assert error.startswith("FileNotFoundError: ") and str(tmp_path / "missing") in error
    assert lines[1] == f"Last sync command failed with the following error: {error}"
    assert lines[2] == "Trial task failed for trial t" and lines[3].startswith("Traceback")
    assert lines[-1] == "KeyError: 'key'"


@pytest.mark.slow
def test_read_only_credentials_are_refused_before_anything_starts(s3, tmp_path):
    spec = write_sweep(tmp_path, resources={"workers": 1, "cpus_per_worker": 0.5})
    storage = s3.uri(tmp_path.name)
    proc = run_sweep(spec, storage, **s3.env("reader"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    # refused at the first request it may not make: the claim's lookup (moto 5.2.6 refuses it
    # to this reader) or the write probe (moto 5.2.5 allowed the lookup)
    assert re.search(rf"--storage: cannot (read|write to) {re.escape(storage)}/t", proc.stderr)
    assert "ACCESS_DENIED" in proc.stderr and "Traceback" not in proc.stderr
    assert "sweep t:" not in proc.stdout  # no plan printed, no trial started
    assert listing(s3.uri(), tmp_path.name) == []  # the writer's view: nothing was written


def s3_objects(root: str) -> list[str]:
    """Every object under ``root``, as a URI."""
    fs, base = results.filesystem(root)
    return [f"s3://{i.path}" for i in fs.get_file_info(pafs.FileSelector(base, recursive=True))
            if i.type == pafs.FileType.File]


def read_object(uri: str) -> bytes:
    fs, path = results.filesystem(uri)
    with fs.open_input_stream(path) as stream:
        return stream.read()


@pytest.mark.slow
@pytest.mark.timeout(900)  # three driver starts on a busy 2-core machine
def test_outage_then_driver_kill_then_rerun_keeps_every_trial_once_on_s3(s3, tmp_path, capsys):
    """1. The endpoint stops while the first trial's worker writes its round-2 personal state:
    the attempt fails, its retry cannot restore, and the sweep stops naming the storage.
    2. Endpoint back, same command: the trial resumes from its round-1 checkpoint on S3; the
    driver is SIGKILLed while that trial writes its tables (rounds and clients written, trials
    row not): it keeps its checkpoints. 3. Same command: both trials, each once, and no
    checkpoint left on S3."""
    gate, table_gate = tmp_path / "round2.gate", tmp_path / "tables.gate"
    spec = write_sweep(
        tmp_path, seeds=[0, 1], max_concurrent=1, max_failures=1, checkpoint_every=1,
        checkpoint_min_s=0, overrides={"federation.rounds": ROUNDS},
        methods=[{"name": "gated_fedavg_se", "params": {"gate_round": 2, "gate_file": str(gate)}}],
        resources={"workers": 1, "cpus_per_worker": 0.5})
    storage = s3.uri(tmp_path.name)
    root = f"{storage}/t"

    # 1. the outage, while the first trial trains round 2 and is about to checkpoint it
    driver = start_sweep(spec, storage, **PLUGINS, **s3.env())
    try:
        wait_for(gate.exists, 240, "the first trial to reach round 2", driver)
        s3.stop()
        gate.with_name(gate.name + ".release").touch()
        out, err = driver.communicate(timeout=300)
    finally:
        if driver.poll() is None:
            kill_group(driver)
        s3.start()
    assert driver.returncode == 1, err[-3000:]
    assert f"error: the sweep stopped: cannot write to {root}" in err
    assert "run the same command again" in err and "Could not connect" in err
    assert "Traceback" not in out + err, err[-3000:]
    (retry,) = [line for line in out.splitlines() if " retry " in line]
    assert f"cannot write to {root}" in retry and "Could not connect" in retry
    held = gate.read_text().split("/")[0]
    assert [i.base_name for i in listing(root, f"checkpoints/{held}/round-1")] == ["worker-0.pt"]
    assert listing(root, f"checkpoints/{held}/round-2") == []  # never half there
    assert not complete_trials(root)

    # 2. endpoint back: the trial resumes; the driver is killed while its tables are written
    driver = start_sweep(spec, storage, RAYLF_TABLE_GATE=str(table_gate), **PLUGINS, **s3.env())
    try:
        wait_for(table_gate.exists, 240, "the resumed trial to write its tables", driver)
    finally:
        if driver.poll() is None:
            kill_group(driver)
    assert table_gate.read_text() == held
    assert {i.base_name for i in listing(root, "tables/rounds")} == {f"{held}.parquet"}
    assert not complete_trials(root)
    # every checkpoint Tune keeps names a personal-state folder on S3 holding whole states
    objects = s3_objects(root)
    states = [o for o in objects if o.endswith("/state.pt") and f"/{held}/checkpoint_" in o]
    assert states
    for state in states:
        personal = torch.load(io.BytesIO(read_object(state)), weights_only=True)["personal"]
        assert personal.startswith(f"{root}/checkpoints/{held}/")
        assert [o for o in objects if o.startswith(f"{personal}/")] == [f"{personal}/worker-0.pt"]
        assert torch.load(io.BytesIO(read_object(f"{personal}/worker-0.pt")), weights_only=True)

    # 3. the same command again: every trial exactly once
    proc = run_sweep(spec, storage, **PLUGINS, **s3.env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables = results.load(root)
    trials = tables["trials"]
    assert len(trials) == 2 and trials["trial_id"].is_unique and set(trials["status"]) == {"ok"}
    assert dict(zip(trials["trial_id"], trials["attempts"]))[held] == 3
    assert sorted(trials["attempts"]) == [1, 3]  # the retry in 1. found the storage down
    rounds = tables["rounds"].groupby("trial_id")["round"].apply(list)
    assert set(rounds.index) == set(trials["trial_id"])
    assert rounds.map(lambda r: r == list(range(1, ROUNDS + 1))).all()
    clients = tables["clients"]
    assert len(clients) == 2 * ROUNDS * CLIENTS
    assert not clients.duplicated(["trial_id", "round", "client_id", "task"]).any()
    assert complete_trials(root) == set(trials["trial_id"])
    objects = s3_objects(root)
    assert not [o for o in objects if o.endswith(".tmp")]  # an object store needs no rename
    # both trials ended for good: neither a personal state nor a Tune checkpoint's file is left
    assert not [o for o in objects if o.startswith(f"{root}/checkpoints/") or "/checkpoint_" in o]

    # the report, read from and written to S3
    assert report_main([root]) == 0
    printed = capsys.readouterr().out
    assert f"{root}: 2 trials (2 ok)" in printed
    assert f"report: {root}/report/report.md" in printed
    assert read_object(f"{root}/report/report.md").decode() in printed


@pytest.mark.slow
def test_a_second_driver_on_a_running_s3_sweep_exits_2_naming_the_first(s3, tmp_path):
    """The lease on S3 (a conditional put): while the first driver runs, a second of the same
    command exits 2 naming it; the first finishes with every trial once and frees the lease."""
    gate = tmp_path / "round2.gate"
    spec = write_sweep(
        tmp_path, seeds=[0, 1], max_concurrent=1, overrides={"federation.rounds": ROUNDS},
        methods=[{"name": "gated_fedavg_se", "params": {"gate_round": 2, "gate_file": str(gate)}}],
        resources={"workers": 1, "cpus_per_worker": 0.5})
    storage = s3.uri(tmp_path.name)
    root = f"{storage}/t"
    first = start_sweep(spec, storage, **PLUGINS, **s3.env())
    try:
        wait_for(gate.exists, 240, "the first trial to reach round 2", first)
        second = run_sweep(spec, storage, **PLUGINS, **s3.env())
        gate.with_name(gate.name + ".release").touch()
        out, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            kill_group(first)
    assert second.returncode == 2, second.stderr[-3000:]
    assert f"--storage: {root} is in use by another sweep driver: driver pid {first.pid} on " \
           f"host {socket.gethostname()} (this sweep), running since" in second.stderr
    assert "sweep t:" not in second.stdout and "Traceback" not in second.stderr
    assert first.returncode == 0, err[-3000:]
    trials = results.load(root)["trials"]
    assert len(trials) == 2 and trials["trial_id"].is_unique and set(trials["status"]) == {"ok"}
    (record,) = [o for o in s3_objects(root) if "/.lease/" in o]
    assert json.loads(read_object(record))["released"]
