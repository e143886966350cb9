"""Static checks of the cluster configs in cluster/.

The launcher YAMLs are validated against the JSON schema that ships inside the
installed Ray package (the same one `ray up` uses), then against raylf's own
rules: trials never land on the head, GPU node types scale from zero, the image
pins Ray 2.60.0 / Python 3.11, and the dashboard is bound to localhost.
This module deliberately does not import raylf.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml

REPO = Path(__file__).resolve().parents[1]
CLUSTER_DIR = REPO / "cluster"
LAUNCHER_FILES = ["aws-gpu.yaml", "gcp-gpu.yaml"]
KUBERAY_FILE = "kuberay-raycluster.yaml"

RAY_VERSION = "2.60.0"
PY_TAG = "py311"
DASHBOARD_FLAG = "--dashboard-host=127.0.0.1"


def _load(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    assert isinstance(data, dict), f"{path} is not a YAML mapping"
    return data


@pytest.fixture(scope="module")
def ray_schema() -> dict:
    path = Path(os.path.dirname(ray.__file__)) / "autoscaler" / "ray-schema.json"
    assert path.is_file(), f"Ray's launcher schema not found at {path}"
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _validate(config: dict, schema: dict) -> None:
    jsonschema.validate(instance=config, schema=schema)


def _gpu_node_types(config: dict) -> dict:
    return {
        name: spec
        for name, spec in config["available_node_types"].items()
        if spec.get("resources", {}).get("GPU", 0) > 0
    }


def _check_project_rules(config: dict) -> None:
    """raylf's rules for a launcher config; raises AssertionError on a violation."""
    node_types = config["available_node_types"]
    head_name = config["head_node_type"]
    assert head_name in node_types, f"head_node_type {head_name!r} is not defined"
    head = node_types[head_name]
    assert head["resources"].get("CPU") == 0, "head resources must declare CPU: 0"
    assert head["resources"].get("GPU", 0) == 0, "the head must offer no GPU"

    gpu_types = _gpu_node_types(config)
    assert gpu_types, "no worker node type declares a GPU"
    for name, spec in gpu_types.items():
        assert name != head_name
        assert spec.get("min_workers") == 0, f"{name}: min_workers must be 0"
        assert spec.get("max_workers", 0) >= 1, f"{name}: max_workers must be >= 1"
    assert config.get("max_workers", 0) >= 1
    assert "idle_timeout_minutes" in config

    image = config["docker"]["image"]
    tag = image.rsplit(":", 1)[-1]
    assert RAY_VERSION in tag and PY_TAG in tag, f"image {image!r} not pinned"
    assert "gpu" in tag or "cu" in tag, f"image {image!r} is not a GPU image"

    head_cmds = " ".join(config["head_start_ray_commands"])
    assert "ray start --head" in head_cmds
    assert DASHBOARD_FLAG in head_cmds, "dashboard must be bound to 127.0.0.1"
    assert "--dashboard-host=0.0.0.0" not in head_cmds

    # Token auth stays on: set on every node, never disabled.
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        cmds = " ".join(config[key])
        assert "RAY_AUTH_MODE=token" in cmds, f"{key} must keep token auth on"
        assert "RAY_AUTH_MODE=disabled" not in cmds

    assert any("pip install" in c for c in config["setup_commands"])


@pytest.mark.parametrize("name", LAUNCHER_FILES)
def test_launcher_config_matches_ray_schema(name, ray_schema):
    _validate(_load(CLUSTER_DIR / name), ray_schema)


@pytest.mark.parametrize("name", LAUNCHER_FILES)
def test_launcher_config_passes_ray_launcher_validation(name):
    """Ray's own offline checks: defaults filled in, then schema + cross-field rules
    (what `ray up` runs before it talks to the cloud). Private API, pinned Ray."""
    try:
        from ray.autoscaler._private.util import prepare_config, validate_config
    except ImportError:  # pragma: no cover - moved in another Ray version
        pytest.skip("ray.autoscaler._private.util not available")
    prepared = prepare_config(_load(CLUSTER_DIR / name))
    validate_config(prepared)
    _check_project_rules(prepared)


@pytest.mark.parametrize("name", LAUNCHER_FILES)
def test_launcher_config_project_rules(name):
    _check_project_rules(_load(CLUSTER_DIR / name))


def test_gcp_declares_resources_everywhere():
    config = _load(CLUSTER_DIR / "gcp-gpu.yaml")
    assert config["provider"]["type"] == "gcp"
    for name, spec in config["available_node_types"].items():
        if name == config["head_node_type"]:
            continue
        res = spec["resources"]
        assert res.get("CPU", 0) > 0 and res.get("GPU", 0) > 0, name
        accel = spec["node_config"].get("guestAccelerators")
        if accel:
            assert sum(a["acceleratorCount"] for a in accel) == res["GPU"], name


def test_schema_rejects_broken_launcher_config(ray_schema):
    """The checks above can fail: a broken copy is rejected."""
    config = _load(CLUSTER_DIR / "aws-gpu.yaml")

    bad = json.loads(json.dumps(config))
    bad["not_a_launcher_field"] = True
    with pytest.raises(jsonschema.ValidationError):
        _validate(bad, ray_schema)

    bad = json.loads(json.dumps(config))
    next(iter(_gpu_node_types(bad).values()))["min_workers"] = "zero"
    with pytest.raises(jsonschema.ValidationError):
        _validate(bad, ray_schema)

    bad = json.loads(json.dumps(config))
    del bad["provider"]
    with pytest.raises(jsonschema.ValidationError):
        _validate(bad, ray_schema)


def test_project_rules_reject_broken_launcher_config():
    config = _load(CLUSTER_DIR / "aws-gpu.yaml")
    breakers = [
        lambda c: c["available_node_types"][c["head_node_type"]].update(resources={}),
        lambda c: next(iter(_gpu_node_types(c).values())).update(min_workers=1),
        lambda c: c["docker"].update(image="rayproject/ray:latest-gpu"),
        lambda c: c.update(
            head_start_ray_commands=[
                "ray start --head --port=6379 --dashboard-host=0.0.0.0"
            ]
        ),
    ]
    for breaker in breakers:
        bad = json.loads(json.dumps(config))
        breaker(bad)
        with pytest.raises(AssertionError):
            _check_project_rules(bad)


def test_kuberay_manifest():
    manifest = _load(CLUSTER_DIR / KUBERAY_FILE)
    assert manifest["apiVersion"] == "ray.io/v1"
    assert manifest["kind"] == "RayCluster"
    spec = manifest["spec"]
    assert spec["rayVersion"] == RAY_VERSION
    assert spec["enableInTreeAutoscaling"] is True
    assert spec.get("authOptions", {}).get("mode") == "token"

    head = spec["headGroupSpec"]
    params = head["rayStartParams"]
    # KubeRay requires string values in rayStartParams.
    assert params["num-cpus"] == "0"
    assert params["dashboard-host"] == "127.0.0.1"

    def images(group):
        return [c["image"] for c in group["template"]["spec"]["containers"]]

    groups = spec["workerGroupSpecs"]
    assert groups
    all_images = images(head) + [img for g in groups for img in images(g)]
    for image in all_images:
        tag = image.rsplit(":", 1)[-1]
        assert RAY_VERSION in tag and PY_TAG in tag, image

    for group in groups:
        assert group["minReplicas"] == 0, group["groupName"]
        assert group["maxReplicas"] >= 1, group["groupName"]
        assert group.get("replicas", 0) == 0, group["groupName"]
        for container in group["template"]["spec"]["containers"]:
            limits = container["resources"]["limits"]
            assert int(limits["nvidia.com/gpu"]) >= 1, group["groupName"]
    for value in params.values():
        assert isinstance(value, str), "rayStartParams values must be strings"
