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
    assert spec.model_params.hidden == [8, 4]
    assert spec.method_params.mu == 0.5


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


def test_a_method_check_is_reported_with_every_other_error():
    """A problem only the method sees (``Method.check``) joins the component errors in one
    SpecError, so one attempt names everything to fix."""
    raw = small_spec_dict(method={"name": "fedce"}, federation__participation=0.1)
    raw["scenario"]["k"] = "two"
    with pytest.raises(SpecError) as info:
        validate(raw)
    assert [path for path, _ in info.value.problems] == ["scenario.k",
                                                         "federation.participation"]
    assert "at least 2 participants per round" in str(info.value)


@pytest.mark.parametrize("method, changes, field, words", [
    ({"name": "fedce"}, {"federation__participation": 0.1}, "federation.participation",
     "raise federation.participation or federation.num_clients"),
    ({"name": "fc", "params": {"groups": 9}}, {}, "method.params.groups",
     "groups=9 exceeds the 8 clients"),
    ({"name": "spcacw", "params": {"targets": [0, 8]}}, {}, "method.params.targets",
     "distinct client ids in 0..7"),
    ({"name": "selfish_local", "params": {"targets": [1, 1]}}, {}, "method.params.targets",
     "got [1, 1]"),
    ({"name": "spcacw", "params": {"targets": []}}, {}, "method.params.targets", "got []"),
], ids=["fedce-one-participant", "fc-groups-beyond-clients", "spcacw-target-beyond-clients",
        "selfish-repeated-target", "spcacw-no-target"])
def test_method_checks_refuse_at_validation(method, changes, field, words):
    with pytest.raises(SpecError) as info:
        validate(small_spec_dict(method=method, **changes))
    assert [path for path, _ in info.value.problems] == [field]
    assert words in str(info.value)


def test_method_checks_accept_what_the_federation_allows():
    validate(small_spec_dict(method={"name": "fedce"}))  # 4 participants of 8
    validate(small_spec_dict(method={"name": "fc", "params": {"groups": 8}}))
    validate(small_spec_dict(method={"name": "spcacw", "params": {"targets": [7, 0]}}))


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
    assert spec.scenario.name == "label_subset" and spec.scenario_params.k == 2
    assert spec.resources.workers == 4 and spec.resources.gpus_per_worker == 0.25
    assert yaml.safe_load(EXAMPLE.read_text())["method"]["name"] == "fedavg_se"
