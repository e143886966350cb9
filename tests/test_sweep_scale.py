"""What keeps a sweep's cost per trial flat as it grows (benchmarks/sweep_scaling.py measures
it): what Tune pickles per trial holds no other trial, a large grid runs as bounded Tune
experiments, readers use the compacted tables once they match, and Tune's per-trial logs are
written once."""

from __future__ import annotations

import collections
import json
import pickle
import re

import pyarrow.parquet as pq
import pytest

from raylf import results
from raylf.sweep import cli as sweep_cli
from raylf.sweep import stages, tuner
from raylf.sweep.spec import load_sweep
from tests.faults.helpers import attempts, complete_trials
from tests.test_sweep import run_sweep, write_sweep

ROUNDS = 2
MEASURED = re.compile(r".*(_s|_mb)$")  # seconds and memory: measured, not computed


def _grid(tmp_path, seeds: int):
    spec = write_sweep(tmp_path, seeds=list(range(seeds)), overrides={"federation.rounds": ROUNDS},
                       resources={"workers": 1, "cpus_per_worker": 0.5})
    return spec, load_sweep(spec)[1]


def test_what_tune_pickles_per_trial_holds_no_other_trial(tmp_path, monkeypatch):
    """Tune keeps the name, folder and resource callables in every trial's state and in its
    registry: they pickle as a reference to the running stage, the same size for 2 trials as
    for 40, and unpickle as the running stage's (None where no stage runs)."""
    sizes = []
    for seeds in (2, 40):
        _, trials = _grid(tmp_path, seeds)
        stage = stages.GridStage(trials, "t", str(tmp_path / "out"))
        monkeypatch.setattr(tuner, "_running", [stage])
        names, resources = tuner.TrialNames(stage), tuner.TrialResources(stage)
        sizes.append((len(pickle.dumps(names)), len(pickle.dumps(resources))))
        config = stage.tune_configs()[1]
        assert pickle.loads(pickle.dumps(names)).stage is stage
        assert pickle.loads(pickle.dumps(resources))(config).bundles == [{"CPU": 0.75}]
    assert sizes[0] == sizes[1]
    monkeypatch.setattr(tuner, "_running", [])
    assert pickle.loads(pickle.dumps(names)) is None


def test_each_attempt_writes_a_started_row_counting_from_the_row_it_replaces(tmp_path):
    """The trials row an attempt writes before it runs: ``started``, one attempt more than the
    row it replaces (none, a killed attempt's ``started`` row, a failed attempt's row); such a
    trial is not finished, and a report lists it among the trials that did not end ok."""
    from raylf.experiment import run_experiment
    from raylf.sweep.trial import announce, finished_row

    _, trials = _grid(tmp_path, 1)
    trial = trials[0]
    stage = stages.GridStage(trials, "t", str(tmp_path / "out"))
    root, trial_id = stage.root, trial.trial_id
    assert announce(root, trial, stage, "inline", None) == 1
    row = results.read_trial(root, trial_id)
    assert (row["status"], row["attempts"], row["backend"]) == (results.STARTED, 1, "inline")
    assert "started and has recorded no end" in row["error"]
    assert finished_row(root, trial_id, row) is None
    assert announce(root, trial, stage, "inline", row) == 2  # the first attempt was killed
    assert attempts(root, trial_id) == 2 and not complete_trials(root)
    failed = {**results.read_trial(root, trial_id), "status": "failed", "attempts": 4}
    assert announce(root, trial, stage, "inline", failed) == 5
    run_experiment(trial.spec, backend="local", out=root, trial_id=trial_id, sweep="t",
                   extra={"attempts": 5})
    row = results.read_trial(root, trial_id)
    assert (row["status"], row["attempts"]) == ("ok", 5)
    assert finished_row(root, trial_id, row) == row and complete_trials(root) == {trial_id}


def test_a_grid_above_the_bound_runs_as_equal_parts_by_trial_id(tmp_path, monkeypatch):
    _, trials = _grid(tmp_path, 5)
    stage = stages.GridStage(trials, "t", str(tmp_path / "out"))
    assert stage.experiments() == [stage]
    monkeypatch.setattr(stages, "TRIALS_PER_EXPERIMENT", 2)
    parts = stage.experiments()
    root = f"{tmp_path / 'out'}/t"
    assert [(p.name, p.path, p.storage_path, p.planned) for p in parts] == [
        (f"part-{i}", f"{root}/part-{i}", root, n) for i, n in ((1, 2), (2, 2), (3, 1))]
    ids = [c["trial_id"] for p in parts for c in p.tune_configs()]
    assert ids == sorted(t.trial_id for t in trials)
    # the same parts again: a resume finds them
    assert [p.specs for p in stage.experiments()] == [p.specs for p in parts]


def test_a_grid_in_parts_runs_and_resumes_each_trial_once(ray_cluster, tmp_path, monkeypatch,
                                                          capsys):
    """Three trials in Tune experiments of at most two: every trial once, its Tune folder and
    its JSON record (``--log json``) in its part's folder; run again, nothing runs twice."""
    monkeypatch.setattr(stages, "TRIALS_PER_EXPERIMENT", 2)
    for name in ("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "TUNE_DISABLE_STRICT_METRIC_CHECKING",
                 "RAY_AIR_NEW_OUTPUT"):  # what the sweep sets for Tune: unset again after
        monkeypatch.delenv(name, raising=False)
    spec, trials = _grid(tmp_path, 3)
    storage = tmp_path / "out"
    root = storage / "t"
    for _ in range(2):
        assert sweep_cli.main([str(spec), "--storage", str(storage), "--log", "json"]) == 0
        out = capsys.readouterr().out
        tables = results.load(root)
        ids = sorted(tables["trials"]["trial_id"])
        assert ids == sorted(t.trial_id for t in trials) and set(tables["trials"]["status"]) == {
            "ok"}
        assert sorted(tables["rounds"]["round"]) == sorted(list(range(1, ROUNDS + 1)) * 3)
        assert complete_trials(root) == set(ids)
        assert {t: attempts(root, t) for t in ids} == dict.fromkeys(ids, 1)
    assert "resuming: 3 of 3 trials already finished" in out
    folders = {p.parent.name: p.name for p in root.glob("part-*/*/result.json")}
    assert sorted(folders) == ids and set(folders.values()) == {"result.json"}
    assert sorted({p.parent.parent.name for p in root.glob("part-*/*/result.json")}) == [
        "part-1", "part-2"]
    for trial_id in ids:
        (folder,) = root.glob(f"part-*/{trial_id}")
        assert json.loads((folder / "params.json").read_text())["trial_id"] == trial_id
        assert [json.loads(line)["round"] for line in
                (folder / "result.json").read_text().splitlines()][-1] == ROUNDS


def test_a_grid_runs_in_groups_of_the_same_bundles_fixed_by_the_trial_ids(tmp_path,
                                                                          monkeypatch):
    _, trials = _grid(tmp_path, 5)
    stage = stages.GridStage(trials, "t", str(tmp_path / "out"), per_tune_trial=2)
    ids = sorted(t.trial_id for t in trials)
    assert stage.groups == {f"{ids[0]}-and-1": ids[:2], f"{ids[2]}-and-1": ids[2:4],
                            ids[4]: ids[4:]}
    assert stage.tune_trials == 3 and stage.planned == 5
    configs = stage.tune_configs()
    assert [c["trial_id"] for c in configs] == list(stage.groups)
    # a group of one shows its trial as before
    assert configs[0]["trials"] == 2 and configs[2]["seed"] == stage.trial(ids[4]).spec.seed
    assert [t.trial_id for t in stage.members(configs[1])] == ids[2:4]
    # another resource shape starts a new group; each part of a large grid groups its own
    shaped = stage.shapes | {ids[1]: "other"}
    monkeypatch.setattr(stage, "shapes", shaped)
    assert list(stage._grouped(ids).values()) == [ids[:1], ids[1:2], ids[2:4], ids[4:]]
    monkeypatch.setattr(stages, "TRIALS_PER_EXPERIMENT", 3)
    assert [list(p.groups.values()) for p in stage.experiments()] == [
        [ids[:1], ids[1:2], ids[2:3]], [ids[3:5]]]


def test_a_group_in_one_tune_trial_writes_what_each_trial_alone_writes(ray_cluster, tmp_path,
                                                                       monkeypatch, capsys):
    """``trials_per_tune_trial: 3`` over four seeds: two Tune trials (a group of three, one
    alone), and every trial's tables, attempts and console line as when each is a Tune trial of
    its own, number for number; run again, nothing runs twice."""
    for name in ("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "TUNE_DISABLE_STRICT_METRIC_CHECKING",
                 "RAY_AIR_NEW_OUTPUT"):  # what the sweep sets for Tune: unset again after
        monkeypatch.delenv(name, raising=False)
    tables = {}
    for per_tune_trial in (1, 3):
        folder = tmp_path / str(per_tune_trial)
        folder.mkdir()
        spec = write_sweep(folder, seeds=[0, 1, 2, 3], overrides={"federation.rounds": ROUNDS},
                           resources={"workers": 1, "cpus_per_worker": 0.5},
                           trials_per_tune_trial=per_tune_trial)
        assert sweep_cli.main([str(spec), "--storage", str(folder / "out")]) == 0
        out = capsys.readouterr().out
        assert sorted(re.findall(r"\] ok +fedavg seed=(\d)", out)) == ["0", "1", "2", "3"]
        tables[per_tune_trial] = results.load(folder / "out" / "t")
    root = tmp_path / "3" / "out" / "t"
    assert len(list(root.glob("*-and-2"))) == 1  # the group's Tune folder
    ids = sorted(tables[3]["trials"]["trial_id"])
    assert {t: attempts(root, t) for t in ids} == dict.fromkeys(ids, 1)
    for name, keys in (("trials", ["seed"]), ("rounds", ["trial_id", "round"]),
                       ("clients", ["trial_id", "round", "client_id"])):
        alone, grouped = (tables[k][name].sort_values(keys).reset_index(drop=True)
                          for k in (1, 3))
        same = [c for c in alone if not MEASURED.match(c) and not c.startswith("env.")]
        assert len(grouped) == len(alone) > 0
        assert alone[same].equals(grouped[same]), name
    assert sweep_cli.main([str(tmp_path / "3" / "sweep.yaml"), "--storage",
                           str(tmp_path / "3" / "out")]) == 0
    assert "resuming: 4 of 4 trials already finished" in capsys.readouterr().out
    assert {t: attempts(root, t) for t in ids} == dict.fromkeys(ids, 1)


def test_readers_use_the_compacted_table_while_it_matches_the_trials_files(tmp_path):
    fs, base = results.filesystem(tmp_path)
    for trial_id in ("a", "b"):
        results.write_table(tmp_path, "trials", trial_id, results.to_table(
            [{"trial_id": trial_id, "status": "ok"}], {}))
    written = results.compact(tmp_path)["trials"]
    assert pq.read_schema(written).metadata[results.FINGERPRINT.encode()]
    # the compacted file is what is read: a row only it holds shows
    marked = pq.read_table(written)
    pq.write_table(marked.set_column(1, "status", [["compacted", "compacted"]]), written)
    assert set(results.read_table(tmp_path, "trials")["status"].to_pylist()) == {"compacted"}
    # a trial's file written since: the per-trial files again, this trial included
    results.write_table(tmp_path, "trials", "c", results.to_table(
        [{"trial_id": "c", "status": "ok"}], {}))
    table = results.read_table(tmp_path, "trials")
    assert table["trial_id"].to_pylist() == ["a", "b", "c"]
    assert set(table["status"].to_pylist()) == {"ok"}
    assert table.column("status").num_chunks == 1


@pytest.mark.parametrize("batch", [1, 2, 500])
def test_per_trial_files_joined_in_batches_equal_one_join(tmp_path, monkeypatch, batch):
    """A column that is all null in one trial's file (written as float) and text in another's
    joins as text whatever batch the two fall in."""
    rows = [{"trial_id": "a", "weights": None}, {"trial_id": "b", "weights": "w.pt"},
            {"trial_id": "c", "weights": None}]
    for row in rows:
        results.write_table(tmp_path, "trials", row["trial_id"], results.to_table([row], {}))
    monkeypatch.setattr(results, "BATCH", batch)
    table = results.read_table(tmp_path, "trials")
    assert table.to_pylist() == rows and str(table.schema.field("weights").type) == "string"


def _uploads(log: str, bucket: str) -> collections.Counter:
    """Objects whose upload completed, by key, from moto's request log: a single PUT, or the
    POST that completes a multipart upload."""
    done: collections.Counter = collections.Counter()
    for verb, key, query in re.findall(rf'"(PUT|POST) /{bucket}/(\S*?)(?:\?(\S*))? HTTP', log):
        if (verb == "PUT" and "partNumber" not in query) or (
                verb == "POST" and "uploadId=" in query):
            done[key] += 1
    return done


@pytest.mark.slow
def test_on_s3_a_trial_writes_three_objects_and_no_folder_markers(s3, tmp_path):
    """Per trial on S3: its three tables, the trials row twice (``started`` before the attempt
    runs, then its end) and the others once (Tune's JSON record only under ``--log json``); no
    attempt markers, no folder marker objects for tables (pyarrow writes one per level of every
    folder it is asked to create). (Tune's snapshots upload the staging folder of each trial
    that is running, a marker each; the trial's end removes it.)"""
    from tests.s3 import BUCKET

    spec, trials = _grid(tmp_path, 3)
    storage = s3.uri(tmp_path.name)
    lines_before = len(s3.log.read_text().splitlines())
    proc = run_sweep(spec, storage, **s3.env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Failed to fetch metrics" not in proc.stderr  # Tune's end, without --log json
    log = "\n".join(s3.log.read_text().splitlines()[lines_before:])
    uploads = _uploads(log, BUCKET)
    root = f"{tmp_path.name}/t"
    for trial in trials:
        own = {key.removeprefix(f"{root}/"): count for key, count in uploads.items()
               if trial.trial_id in key}
        own.pop(f"{trial.trial_id}/", None)  # Tune's staging folder, while it ran
        assert own == {f"tables/{name}/{trial.trial_id}.parquet": 2 if name == "trials" else 1
                       for name in results.TABLES}
    markers = [key for key in uploads if key.endswith("/")]
    assert not [key for key in markers if "/tables/" in key], markers
