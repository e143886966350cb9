"""The largest size a cluster recipe can grow to, read from the recipe file itself, so a sweep
can be planned and costed against a cluster before it is started (``--cluster RECIPE``).

Two recipe kinds ship in cluster/: Ray cluster launcher files (``ray up``: node types with their
``resources`` and ``max_workers``, and a global ``max_workers`` over all worker nodes) and
KubeRay ``RayCluster`` manifests (worker groups with ``maxReplicas`` and the container limits or
``rayStartParams`` that become Ray's CPU and GPU resources). The head counts with what it
declares (the shipped recipes give it no CPUs, so no trial lands there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from raylf.errors import SpecError
from raylf.raycluster import Capacity


@dataclass(frozen=True)
class Recipe:
    path: str
    nodes: dict[str, int]  # node type → how many the largest cluster holds (head included)
    most: dict[str, float]  # CPU / GPU totals of that cluster

    @property
    def capacity(self) -> Capacity:
        return Capacity(self.most, self.most)  # planned at its largest, already grown

    @property
    def where(self) -> str:
        nodes = ", ".join(f"{n} × {kind}" for kind, n in self.nodes.items() if n)
        return f"recipe {self.path} at its largest: {nodes}"


def cluster_recipe(path: str) -> Recipe:
    """The recipe at ``path`` at its largest; a SpecError naming ``--cluster`` if it is not one."""
    file = Path(path)
    try:
        doc = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise SpecError([("--cluster", f"cannot read {path}: {err}")]) from None
    if isinstance(doc, dict) and "available_node_types" in doc:
        return _launcher(path, doc)
    if isinstance(doc, dict) and doc.get("kind") == "RayCluster":
        return _kuberay(path, doc)
    raise SpecError([("--cluster", (
        f"{path} is neither a Ray cluster launcher file (available_node_types) nor a KubeRay "
        "RayCluster manifest; give one of cluster/*.yaml"))])


def _launcher(path: str, doc: dict[str, Any]) -> Recipe:
    """Workers fill the global ``max_workers`` from the node types with the most GPUs (then
    CPUs) per node, each up to its own ``max_workers``: the most the autoscaler can hold."""
    types = doc["available_node_types"]
    head = doc.get("head_node_type")
    cap = doc.get("max_workers", math.inf)
    nodes = {head: 1} if head in types else {}
    order = sorted((k for k in types if k != head), key=lambda k: (
        -types[k].get("resources", {}).get("GPU", 0), -types[k].get("resources", {}).get("CPU", 0)))
    left = cap
    for kind in order:
        count = int(min(types[kind].get("max_workers", left), left))
        if count:
            nodes[kind] = count
            left -= count
    return Recipe(path, nodes, _totals({k: types[k].get("resources", {}) for k in nodes}, nodes))


def _kuberay(path: str, doc: dict[str, Any]) -> Recipe:
    spec = doc.get("spec", {})
    groups = {"head": (spec.get("headGroupSpec") or {}, 1)}
    for group in spec.get("workerGroupSpecs") or []:
        groups[group.get("groupName", "workers")] = (group, int(group.get("maxReplicas", 0)))
    nodes = {name: count for name, (_, count) in groups.items()}
    resources = {name: _pod_resources(group) for name, (group, _) in groups.items()}
    return Recipe(path, nodes, _totals(resources, nodes))


def _pod_resources(group: dict[str, Any]) -> dict[str, float]:
    """Ray's CPU / GPU of one pod: ``rayStartParams`` where given, else the container limits
    (what KubeRay passes to ``ray start``)."""
    params = group.get("rayStartParams") or {}
    containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or [{}]
    limits = (containers[0].get("resources") or {}).get("limits") or {}
    cpu = params.get("num-cpus", limits.get("cpu", 0))
    gpu = params.get("num-gpus", limits.get("nvidia.com/gpu", 0))
    return {"CPU": _quantity(cpu), "GPU": _quantity(gpu)}


def _quantity(value: Any) -> float:
    """A Kubernetes quantity as a number ("4", 4, "500m")."""
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _totals(resources: dict[str, dict[str, float]], nodes: dict[str, int]) -> dict[str, float]:
    return {kind: float(sum(resources[n].get(kind, 0) * count for n, count in nodes.items()))
            for kind in ("CPU", "GPU")}
