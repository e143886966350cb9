"""Spec validation: every bad input names its field, exits 2, and nothing (not Ray) starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from raylf import run
from raylf.config import SpecError, load_spec, validate
from tests.conftest import small_spec_dict

EXAMPLE = Path(__file__).resolve().parents[1] / "tune/examples/digits_label_skew.yaml"


@pytest.fixture
def no_ray(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("Ray was started for an invalid spec")

    monkeypatch.setattr("raylf.raycluster.connect", refuse)


@pytest.mark.parametrize("override, field, words", [
    ("method.name=fedsgd", "method.name", "unknown method 'fedsgd'; allowed: "),
    ("federation.rondes=3", "federation.rondes", "unknown field"),
    ("federation.participation=1.5", "federation.participation", "less than or equal to 1"),
    ("method.params.mu=lots", "method.params.mu", "valid number"),
    ("method.params.gamma=1", "method.params.gamma", "unknown field"),
    ("scenario.k=0", "scenario.k", "greater than or equal to 1"),
    ("resources.gpus_per_worker=0.3", "resources.gpus_per_worker", "1/n"),
    ("model.name=vit", "model.name", "unknown model"),
])
def test_bad_input_names_field_and_exits_2(override, field, words, capsys, no_ray, tmp_path):
    extra = ["--set", "method.name=fedprox"] if "mu" in override else []
    code = run.main([str(EXAMPLE), "--out", str(tmp_path), *extra, "--set", override])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{field}: " in err and words in err, err
    assert not (tmp_path / "tables").exists()


def test_cli_exit_code_is_2_in_a_real_process(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "raylf.run", str(EXAMPLE), "--out", str(tmp_path),
         "--set", "federation.participation=1.5"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "federation.participation" in proc.stderr
    assert "Ray" not in proc.stdout + proc.stderr.replace("raylf", "")


def test_overrides_are_typed_like_yaml():
    spec = load_spec(EXAMPLE, ["federation.optimizer.lr=0.1", "model.hidden=[8, 4]",
                               "method.name=fedprox", "method.params.mu=0.5"])
    assert spec.federation.optimizer.lr == 0.1
    assert spec.model.params.hidden == [8, 4]
    assert spec.method.hparams.mu == 0.5


def test_structure_errors_come_before_component_errors():
    raw = small_spec_dict()
    raw["federation"]["participation"] = 0
    raw["scenario"]["k"] = "two"
    with pytest.raises(SpecError) as info:
        validate(raw)
    fields = [path for path, _ in info.value.problems]
    assert fields == ["federation.participation"]  # structure first; components after it passes
    raw["federation"]["participation"] = 0.5
    with pytest.raises(SpecError) as info:
        validate(raw)
    assert [path for path, _ in info.value.problems] == ["scenario.k"]


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(SpecError, match="not found"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("federation: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)


def test_example_spec_is_valid_and_declares_gpu_shares():
    spec = load_spec(EXAMPLE)
    assert spec.federation.num_clients == 20
    assert spec.scenario.name == "label_subset" and spec.scenario.params.k == 2
    assert spec.resources.workers == 4 and spec.resources.gpus_per_worker == 0.25
    assert yaml.safe_load(EXAMPLE.read_text())["method"]["name"] == "fedavg_se"
