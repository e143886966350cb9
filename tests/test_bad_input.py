"""Bad input: each kind exits 2 with one message naming the field and the fix, nothing started.

Most cases call the CLIs' ``main`` in this process (no Ray needed before the error); those
that need a cluster to be refused use the session's, and two run as a user would, in a fresh
process with a Ray that has no GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from raylf import run
from raylf.sweep import cli as sweep_cli
from tests.conftest import small_spec_dict
from tests.test_sweep import ROOT, env, write_sweep


def experiment_file(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(small_spec_dict(**changes), sort_keys=False))
    return path


def npz(tmp_path: Path, **arrays) -> str:
    path = tmp_path / "data.npz"
    np.savez(path, **arrays)
    return str(path)


def corrupt_manifest(tmp_path: Path, monkeypatch) -> None:
    from raylf.data import manifest

    folder = tmp_path / "manifests"
    folder.mkdir()
    (folder / "cifar10.yaml").write_text("name: cifar10\nfiles: [{broken\n")
    monkeypatch.setattr(manifest, "manifest_folder", lambda: folder)


# id, spec changes (small_spec_dict keywords), --set overrides, field named, fix named
EXPERIMENTS = [
    ("rounds-below-range", {"federation__rounds": 0}, [], "federation.rounds",
     "greater than or equal to 1"),
    ("participation-above-range", {"federation__participation": 1.5}, [],
     "federation.participation", "less than or equal to 1"),
    ("clients-wrong-type", {"federation__num_clients": "many"}, [], "federation.num_clients",
     "valid integer"),
    ("lr-wrong-type", {"federation__optimizer__lr": "fast"}, [], "federation.optimizer.lr",
     "valid number"),
    ("timeout-below-range", {"resources__trial_timeout_s": -5}, [],
     "resources.trial_timeout_s", "greater than 0"),
    ("unknown-field", {"federation__rondes": 3}, [], "federation.rondes", "unknown field"),
    ("unknown-method", {}, ["method.name=fedsgd"], "method.name", "allowed: "),
    ("unknown-dataset", {"dataset": {"name": "imagenet"}}, [], "dataset.name", "allowed: "),
    ("unknown-scenario", {"scenario": {"name": "shards"}}, [], "scenario.name", "allowed: "),
    ("unknown-model", {"model": {"name": "vit"}}, [], "model.name", "allowed: "),
    ("unknown-method-param", {}, ["method.name=fedprox", "method.params.muu=1"],
     "method.params.muu", "unknown field"),
    ("method-param-range", {}, ["method.name=fedprox", "method.params.mu=-1"],
     "method.params.mu", "greater than or equal to 0"),
    ("gpu-share-not-1-over-n", {"resources__gpus_per_worker": 0.3}, [],
     "resources.gpus_per_worker", "1/n"),
    ("replicated-stateful-method", {"resources__client_data": "replicated"}, [],
     "resources.client_data", "use sharded or auto"),
    ("multi-task-method-single-task-data", {"method": {"name": "fmtsvm"}}, [], "method.name",
     "digits_multitask"),
    ("method-check-one-participant",
     {"method": {"name": "fedce"}, "federation__participation": 0.1}, [],
     "federation.participation", "fedce needs at least 2 participants per round"),
    ("method-check-groups-beyond-clients", {"method": {"name": "fc", "params": {"groups": 9}}},
     [], "method.params.groups", "use at most federation.num_clients"),
    ("oracle-on-scenario-without-groups",
     {"method": {"name": "clustered_oracle"}, "scenario": {"name": "iid"}}, [], "method.name",
     "has none (use one of: "),
    ("label-subset-beyond-classes", {"scenario": {"name": "label_subset", "k": 20}}, [],
     "scenario", "exceeds the 10 classes"),
    ("partition-leaves-client-without-data", {"scenario": {"name": "iid"}},
     ["federation.num_clients=1000"], "scenario", "at least two samples"),
    ("override-without-value", {}, ["federation.rounds"], "federation.rounds",
     "dotted.key=value"),
    ("unknown-preset", {"preset": "hdcfl-c11"}, [], "preset", "allowed: "),
    ("normalize-unknown-mode", {"dataset": {"name": "digits", "normalize": "zscore"}}, [],
     "dataset.normalize", "'standard', 'unit' or 'none'"),
    ("normalize-unit-on-synthetic", {"dataset": {"name": "synthetic", "normalize": "unit"}}, [],
     "dataset.normalize", "use standard (per feature, on the training split) or none"),
    ("normalize-on-token-ids", {"dataset": {"name": "shakespeare", "normalize": "standard"}}, [],
     "dataset.normalize", "remove dataset.normalize"),
    # every number finite: an infinite value is refused (exit 2), not run into a divergence
    ("infinite-lr", {}, ["federation.optimizer.lr=inf"], "federation.optimizer.lr",
     "finite number"),
    ("infinite-weight-decay", {"federation__optimizer__weight_decay": float("inf")}, [],
     "federation.optimizer.weight_decay", "finite number"),
    ("infinite-grad-clip", {}, ["federation.optimizer.grad_clip=.inf"],
     "federation.optimizer.grad_clip", "finite number"),
    ("infinite-divergence-loss", {}, ["federation.divergence_loss=inf"],
     "federation.divergence_loss", "finite number"),
    ("nan-divergence-loss", {}, ["federation.divergence_loss=nan"],
     "federation.divergence_loss", "finite number"),
    ("infinite-round-timeout", {}, ["resources.round_timeout_s=inf"],
     "resources.round_timeout_s", "finite number"),
    ("infinite-trial-timeout", {}, ["resources.trial_timeout_s=inf"],
     "resources.trial_timeout_s", "finite number"),
    ("infinite-method-param", {}, ["method.name=fedprox", "method.params.mu=inf"],
     "method.params.mu", "finite number"),
    ("infinite-dataset-param", {"dataset": {"name": "synthetic", "separation": float("inf")}},
     [], "dataset.separation", "finite number"),
    # a name becomes a folder or file name under the storage: nothing may take it elsewhere
    ("name-with-separators", {"name": "../escaped"}, [], "name", "do not start with '.'"),
    ("name-dot", {}, ["name=."], "name", "do not start with '.'"),
    ("name-dot-dot", {}, ["name=.."], "name", "do not start with '.'"),
    ("name-with-slash", {}, ["name=a/b"], "name", "letters, digits, '_', '-' and '.'"),
]


@pytest.mark.parametrize("changes, overrides, field, fix",
                         [c[1:] for c in EXPERIMENTS], ids=[c[0] for c in EXPERIMENTS])
def test_bad_experiment_spec(tmp_path, capsys, changes, overrides, field, fix):
    code = run.main([str(experiment_file(tmp_path, **changes)), "--out", str(tmp_path / "out"),
                     "--backend", "local", *(f"--set={o}" for o in overrides)])
    assert_refused(code, capsys.readouterr().err, field, fix, tmp_path / "out")


def test_a_trial_id_that_would_escape_the_out_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "deep" / "out"
    code = run.main([str(experiment_file(tmp_path)), "--out", str(out), "--backend", "local",
                     "--trial-id", "../../escaped"])
    assert_refused(code, capsys.readouterr().err, "--trial-id", "do not start with '.'",
                   tmp_path / "deep")
    assert not list(tmp_path.rglob("*.parquet"))


@pytest.mark.parametrize("uri", [
    "s3://AKIAEXAMPLEKEY:wJalrXUtnFEMI/K7MDENG+bPxRfiCY@bucket/sweeps",  # a secret may hold /
    "s3://AKIAEXAMPLEKEY:wJalrXUtnFEMIK7MDENGbPxRfiCY@bucket/sweeps",
    "s3://AKIAEXAMPLEKEY@bucket/sweeps",
], ids=["key-and-secret-with-slash", "key-and-secret", "key"])
@pytest.mark.parametrize("cli", ["run", "sweep"])
def test_credentials_in_a_storage_uri_are_refused_and_never_printed(tmp_path, capsys, uri, cli):
    if cli == "run":
        code = run.main([str(experiment_file(tmp_path)), "--out", uri, "--backend", "local"])
    else:
        code = sweep_cli.main([str(write_sweep(tmp_path)), "--storage", uri])
    printed = capsys.readouterr()
    flag = "--out" if cli == "run" else "--storage"
    assert_refused(code, printed.err, flag, "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY")
    assert "credentials" in printed.err
    for secret in ("AKIAEXAMPLEKEY", "wJalrXUtnFEMI", "bPxRfiCY"):
        assert secret not in printed.out + printed.err


def test_a_method_check_and_a_field_error_exit_2_in_one_message(tmp_path, capsys):
    """A problem only the method sees (``Method.check``) is reported with the spec's other
    errors, not after they are fixed."""
    spec = experiment_file(tmp_path, method={"name": "spcacw", "params": {"targets": [0, 9]}})
    code = run.main([str(spec), "--out", str(tmp_path / "out"), "--backend", "local",
                     "--set=scenario.k=0"])
    err = capsys.readouterr().err
    assert_refused(code, err, "scenario.k", "greater than or equal to 1", tmp_path / "out")
    assert "method.params.targets: targets must be distinct client ids in 0..7" in err


@pytest.mark.parametrize("arrays, fix", [
    ({"x": np.zeros((20, 4), np.float32)}, "lacks array(s) ['y']"),
    ({"x": np.zeros((20, 4), np.float32), "y": np.zeros(19, np.int64)},
     "must be 20 integer labels"),
    ({"x": np.where(np.eye(20, 4) > 0, np.nan, 1.0).astype(np.float32),
      "y": np.arange(20) % 2}, "holds NaN or infinite values in 4 sample(s) (first: index 0)"),
    ({"x": np.full((20, 4), np.inf, np.float32), "y": np.arange(20) % 2},
     "holds NaN or infinite values in 20 sample(s)"),
    ({"x": np.ones((20, 4), np.float32), "y": np.arange(20) % 2},
     "one constant value in every sample"),
    ({"x": np.eye(20, 4, dtype=np.float32), "y": np.full(20, 3)}, "has one class only (3)"),
    ({"x": np.eye(20, 4, dtype=np.float32), "y": np.arange(20) % 2,
      "y_second": np.zeros(20, np.int64)}, "y_second in"),  # the task is named
    ({"x": np.eye(20, 4, dtype=np.float32), "y": np.arange(20) % 2.0},
     "must be 20 integer labels"),
    ({"x": np.array([["a"] * 4] * 20), "y": np.arange(20) % 2}, "must hold numbers; got <U1"),
], ids=["npz-without-y", "npz-mismatched-lengths", "npz-nan-features", "npz-inf-features",
        "npz-constant-features", "npz-one-class", "npz-task-with-one-class", "npz-float-labels",
        "npz-text-features"])
def test_bad_own_data(tmp_path, capsys, arrays, fix):
    spec = experiment_file(tmp_path, dataset={"name": "npz", "path": npz(tmp_path, **arrays)})
    code = run.main([str(spec), "--out", str(tmp_path / "out"), "--backend", "local"])
    err = capsys.readouterr().err
    assert_refused(code, err, "dataset.path", fix, tmp_path / "out")
    assert "arrays x (N samples) and y (N integer labels)" in err


_IDS = np.arange(40) % 8  # the owning client of each of 40 samples, for the 8 clients of the spec
_SPLIT = np.where(np.arange(40) // 8 % 4 == 0, "test", "train")  # 2 test, 3 train each


# id, arrays besides x and y, scenario, field named, fix named
GIVEN = [
    ("given-without-client-array", {}, {}, "scenario.name", "add a client array to the npz"),
    ("client-length-differs-from-y", {"client": _IDS[:39]}, {}, "dataset.path",
     "must be 40 integer client ids (one per sample of x)"),
    ("client-negative-ids", {"client": _IDS - 1}, {}, "dataset.path", "number the clients 0..N-1"),
    ("split-without-client", {"split": _SPLIT}, {}, "dataset.path",
     "comes without a client array; add client"),
    ("split-unknown-value", {"client": _IDS, "split": np.where(_SPLIT == "test", "test",
                                                               "training")}, {},
     "dataset.path", "unknown value(s) ['training']; allowed: train, val, test"),
    ("client-count-differs-from-num-clients", {"client": _IDS % 4}, {},
     "federation.num_clients", "set federation.num_clients=4"),
    ("client-ids-not-0-to-n-1", {"client": np.where(_IDS == 7, 9, _IDS)}, {}, "dataset.path",
     "ids without samples: [7]; ids beyond: [9]; renumber them 0..N-1"),
    ("client-without-training-data",
     {"client": _IDS, "split": np.where(_IDS == 3, "test", _SPLIT)}, {}, "dataset.path",
     "client(s) 3 of the client array have no training samples"),
    ("fraction-with-a-given-split", {"client": _IDS, "split": _SPLIT}, {"test_fraction": 0.3},
     "scenario.test_fraction", "remove scenario.test_fraction"),
]


@pytest.mark.parametrize("arrays, scenario, field, fix", [c[1:] for c in GIVEN],
                         ids=[c[0] for c in GIVEN])
def test_bad_given_partition(tmp_path, capsys, arrays, scenario, field, fix):
    data = npz(tmp_path, x=np.eye(40, 4, dtype=np.float32), y=np.arange(40) % 4, **arrays)
    spec = experiment_file(tmp_path, dataset={"name": "npz", "path": data},
                           scenario={"name": "given", **scenario})
    code = run.main([str(spec), "--out", str(tmp_path / "out"), "--backend", "local"])
    assert_refused(code, capsys.readouterr().err, field, fix, tmp_path / "out")


def test_missing_data_offline_names_the_fetch_command(tmp_path, capsys):
    spec = experiment_file(tmp_path, dataset={"name": "cifar10", "root": str(tmp_path / "c")})
    code = run.main([str(spec), "--out", str(tmp_path / "out"), "--backend", "local"])
    assert_refused(code, capsys.readouterr().err, "dataset.name",
                   f"python -m raylf.datasets fetch cifar10 --root {tmp_path / 'c'}",
                   tmp_path / "out")


def test_corrupt_manifest_names_the_file(tmp_path, capsys, monkeypatch):
    corrupt_manifest(tmp_path, monkeypatch)
    spec = experiment_file(tmp_path, dataset={"name": "cifar10", "root": str(tmp_path / "c")})
    code = run.main([str(spec), "--out", str(tmp_path / "out"), "--backend", "local"])
    assert_refused(code, capsys.readouterr().err, "dataset.name",
                   str(tmp_path / "manifests" / "cifar10.yaml"), tmp_path / "out")


@pytest.mark.parametrize("name, fix", [
    ("missing.yaml", "spec file not found"),
    ("broken.yaml", "not valid YAML"),
], ids=["spec-file-missing", "spec-not-yaml"])
def test_unreadable_spec_file(tmp_path, capsys, name, fix):
    (tmp_path / "broken.yaml").write_text("federation: {rounds: [1,\n")
    code = run.main([str(tmp_path / name), "--out", str(tmp_path / "out")])
    assert_refused(code, capsys.readouterr().err, "<root>", fix, tmp_path / "out")


def test_impossible_resources_for_one_experiment(ray_cluster, tmp_path, capsys):
    spec = experiment_file(tmp_path, resources__cpus_per_worker=64)
    code = run.main([str(spec), "--out", str(tmp_path / "out")])
    assert_refused(code, capsys.readouterr().err, "resources.cpus_per_worker",
                   "the cluster has 2", tmp_path / "out")


# id, sweep fields, extra CLI arguments, field named, fix named
SWEEPS = [
    ("empty-grid-axis", {"grid": {"federation.local_epochs": []}}, [], "grid",
     "give at least one"),
    ("duplicate-grid-points", {"grid": {"federation.local_epochs": [1, 2, 1]}}, [], "grid",
     "list each value once"),
    ("duplicate-method-entries", {"methods": [{"name": "fedavg"}, {"name": "fedavg"}]}, [],
     "methods", "remove the repeated entry"),
    ("unknown-grid-field", {"grid": {"federation.rondes": [1, 2]}}, [], "federation.rondes",
     "unknown field"),
    ("unknown-method-in-sweep", {"methods": [{"name": "fedsgd"}]}, [], "method.name",
     "allowed: "),
    ("unknown-method-keeping-final-states", {"keep_final_states": ["hdcf"]}, [],
     "keep_final_states", "allowed: "),
    ("no-seeds", {"seeds": []}, [], "seeds", "at least 1 item"),
    ("max-concurrent-zero", {}, ["--max-concurrent", "0"], "max_concurrent",
     "greater than or equal to 1"),
    ("unknown-sweep-field", {"seed": 1}, [], "seed", "unknown field"),
    ("sweep-name-pattern", {"name": "my sweep!"}, [], "name", "pattern"),
    ("sweep-name-dot-dot", {"name": ".."}, [], "name", "do not start with '.'"),
    ("sweep-name-escaping", {}, ["--name", "../escaped"], "name", "do not start with '.'"),
    ("infinite-sweep-number", {"checkpoint_min_s": float("inf")}, [], "checkpoint_min_s",
     "finite number"),
    ("base-and-inline-experiment", {"base": "tune/examples/digits_label_skew.yaml"}, [],
     "<root>", "give exactly one of base"),
    ("resume-without-sweep", {}, ["--resume"], "--resume", "run without --resume"),
]


@pytest.mark.parametrize("fields, extra, field, fix", [c[1:] for c in SWEEPS],
                         ids=[c[0] for c in SWEEPS])
def test_bad_sweep(ray_cluster, tmp_path, capsys, fields, extra, field, fix):
    storage = tmp_path / "out"
    code = sweep_cli.main([str(write_sweep(tmp_path, **fields)), "--storage", str(storage), *extra])
    assert_refused(code, capsys.readouterr().err, field, fix,
                   storage / "t" / "tables", storage / "t" / "sweep.json")


def test_missing_base_spec(tmp_path, capsys):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "base": "nowhere.yaml"}))
    code = sweep_cli.main([str(path), "--storage", str(tmp_path / "out")])
    assert_refused(code, capsys.readouterr().err, "base", "base spec not found: nowhere.yaml",
                   tmp_path / "out")


def test_sweep_directory_holding_another_sweep(ray_cluster, tmp_path, capsys):
    folder = tmp_path / "out" / "t"
    folder.mkdir(parents=True)
    (folder / "sweep.json").write_text(json.dumps({"trial_ids": ["t-other-s0-0123456789"]}))
    code = sweep_cli.main([str(write_sweep(tmp_path)), "--storage", str(tmp_path / "out")])
    assert_refused(code, capsys.readouterr().err, "name", "choose another --name or --storage",
                   folder / "tables")


def test_a_non_empty_directory_that_holds_no_sweep_is_refused_without_force(tmp_path, capsys):
    """A folder that is not a sweep's (here: someone's files where the sweep would go) is
    neither adopted nor touched; ``--force`` is the way to run there all the same."""
    from raylf.sweep.claim import check_same_sweep

    folder = tmp_path / "out" / "t"
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("not a sweep")
    code = sweep_cli.main([str(write_sweep(tmp_path)), "--storage", str(tmp_path / "out")])
    assert_refused(code, capsys.readouterr().err, "--storage", "pass --force",
                   folder / "sweep.json", folder / ".lease")
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    check_same_sweep(str(folder), {"trial_ids": []}, force=True)  # --force: no objection


def test_unwritable_storage_path(ray_cluster, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    spec = write_sweep(tmp_path, resources={"workers": 1, "cpus_per_worker": 0.5})
    code = sweep_cli.main([str(spec), "--storage", str(blocker / "out")])
    assert_refused(code, capsys.readouterr().err, "--storage",
                   "choose a --storage you may read and write", blocker / "out")


def test_impossible_resources_for_a_sweep(ray_cluster, tmp_path, capsys):
    spec = write_sweep(tmp_path, resources={"workers": 2, "cpus_per_worker": 4})
    code = sweep_cli.main([str(spec), "--storage", str(tmp_path / "out")])
    assert_refused(code, capsys.readouterr().err, "resources", "the Ray cluster has 2",
                   tmp_path / "out")


@pytest.mark.slow
@pytest.mark.parametrize("cli", ["run", "sweep"])
def test_gpu_share_on_a_cluster_without_gpus(tmp_path, cli):
    """As a user runs it: a fresh process starting its own Ray with --num-gpus 0."""
    out = tmp_path / "out"
    if cli == "run":
        args = [str(experiment_file(tmp_path)), "--out", str(out)]
    else:
        args = [str(write_sweep(tmp_path, resources={"workers": 1, "cpus_per_worker": 0.5,
                                                     "gpus_per_worker": 0.25})),
                "--storage", str(out)]
    proc = subprocess.run([sys.executable, "-m", f"raylf.{cli}", *args, "--num-gpus", "0"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env())
    assert_refused(proc.returncode, proc.stderr, "resources.gpus_per_worker",
                   "set resources.gpus_per_worker=0", out)


def assert_refused(code: int, err: str, field: str, fix: str, *not_created: Path) -> None:
    """Exit 2, a message naming ``field`` (as ``field:``) and the ``fix``, nothing created."""
    assert code == 2, err
    assert err.startswith("invalid spec") and f"{field}:" in err and fix in err, err
    for path in not_created:
        assert not path.exists(), f"{path} was created"



def test_yaml_1_1_words_mean_what_the_user_wrote(tmp_path):
    """``off`` / ``no`` are strings in a spec (only true / false are booleans, as in YAML 1.2):
    ``cohort: off`` as docs/experiments.md writes it works in a file and with ``--set``, a boolean
    field still takes ``no``, and a real boolean where a word is wanted is refused naming the
    field."""
    from raylf.config import SpecError, load_spec

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(small_spec_dict(), sort_keys=False)
                    .replace("resources:\n", "resources:\n  cohort: off\n", 1))
    assert "cohort: off" in path.read_text()
    assert load_spec(path).resources.cohort == "off"
    assert load_spec(path, ["resources.cohort=auto"]).resources.cohort == "auto"
    assert load_spec(path, ["resources.cohort=off"]).resources.cohort == "off"
    fedsoft = load_spec(path, ["method.name=fedsoft", "method.params.selection=no"])
    assert fedsoft.method_params.selection is False
    with pytest.raises(SpecError, match="resources.cohort"):
        load_spec(path, ["resources.cohort=true"])
