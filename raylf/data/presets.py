"""Paper presets: every experiment setting of the source papers as a named partial spec.

A spec names one with ``preset: NAME``; ``raylf.config.validate`` merges the preset *under* the
spec, so anything the spec states itself wins. A preset fixes the data side (dataset, scenario,
client count) and the model where the paper fixes it; method, rounds and optimizer stay the
spec's. Where a paper leaves a number out, ``note`` says what raylf chose.
"""

from __future__ import annotations

import copy
from typing import Any

_HDC_CLIENTS = 20
_HDC_NOTE = (f"HDC-FL does not state its client count: raylf uses {_HDC_CLIENTS} clients "
             "(full participation is the spec's choice)")
_MNIST_MLP = {"name": "mlp", "hidden": [64]}  # SP-CACW appendix G: 784-64-10


def _hdcfl(dataset: str, scenario: dict, model: str = "resnet18", extra: str = "") -> dict:
    return {"dataset": {"name": dataset}, "scenario": scenario,
            "federation": {"num_clients": _HDC_CLIENTS}, "model": {"name": model},
            "note": _HDC_NOTE + extra}


_ROT = {"name": "rotation", "groups": 4}
_ROT_NOTE = "; rotation = 4 groups at 0/90/180/270 degrees (paper: 'four rotation conditions')"

PRESETS: dict[str, dict[str, Any]] = {
    # the HDC-FL paper, Table 1 (ResNet-18) and Table 6 (MobileNetV2, prefix m-)
    "hdcfl-c10-ls2": _hdcfl("cifar10", {"name": "label_subset", "k": 2}),
    "hdcfl-c10-ls3": _hdcfl("cifar10", {"name": "label_subset", "k": 3}),
    "hdcfl-c10-rot": _hdcfl("cifar10", _ROT, extra=_ROT_NOTE),
    "hdcfl-c100-a0.07": _hdcfl("cifar100", {"name": "dirichlet", "alpha": 0.07}),
    "hdcfl-c100-a0.3": _hdcfl("cifar100", {"name": "dirichlet", "alpha": 0.3}),
    "hdcfl-c100-ls2": _hdcfl("cifar100", {"name": "label_subset", "k": 2}),
    "hdcfl-c100-ls3": _hdcfl("cifar100", {"name": "label_subset", "k": 3}),
    "hdcfl-c100-rot": _hdcfl("cifar100", _ROT, extra=_ROT_NOTE),
    "hdcfl-m-c10-a0.07": _hdcfl("cifar10", {"name": "dirichlet", "alpha": 0.07}, "mobilenet_v2"),
    "hdcfl-m-c10-ls3": _hdcfl("cifar10", {"name": "label_subset", "k": 3}, "mobilenet_v2"),
    "hdcfl-m-c100-ls3": _hdcfl("cifar100", {"name": "label_subset", "k": 3}, "mobilenet_v2"),
    # the SP-CACW paper, section 5 and appendices G, H.1
    "spcacw-mnist-label-switch": {
        "dataset": {"name": "mnist"}, "scenario": {"name": "label_permutation", "clusters": 3},
        "federation": {"num_clients": 7}, "model": _MNIST_MLP,
        "note": "clients dealt round-robin to clusters (3/2/2); cluster 0 keeps the true labels"},
    "spcacw-mnist-rotation": {
        "dataset": {"name": "mnist"}, "scenario": {"name": "rotation", "step": 4.0},
        "federation": {"num_clients": 89}, "model": _MNIST_MLP,
        "note": "client k sees its images rotated by 4k degrees (0..352), IID labels"},
    "spcacw-c100-eps0.01": {
        "dataset": {"name": "cifar100"},
        "scenario": {"name": "latent_clusters", "clusters": 4, "eps": 0.01},
        "federation": {"num_clients": 20}, "model": {"name": "vgg16_cifar"},
        "note": "noise N(0, eps) read as standard deviation eps on a class mass of 1/25; model: "
                "the paper's VGG16 variant"},
    "spcacw-c100-eps10": {
        "dataset": {"name": "cifar100"},
        "scenario": {"name": "latent_clusters", "clusters": 4, "eps": 10.0},
        "federation": {"num_clients": 20}, "model": {"name": "vgg16_cifar"},
        "note": "eps = 10 swamps the cluster signal (near-random class mass); model: the "
                "paper's VGG16 variant"},
    "spcacw-shakespeare-n15-m7": {
        "dataset": {"name": "shakespeare", "seq_len": 50},
        "scenario": {"name": "natural", "roles_per_client": 7, "gap": 50},
        "federation": {"num_clients": 15}, "model": {"name": "char_lstm"},
        "note": "roles drawn at random among those with >= 100 windows; each role split in "
                "order (last 25% test); model: CharLSTM"},
    "spcacw-shakespeare-n30-m3": {
        "dataset": {"name": "shakespeare", "seq_len": 50},
        "scenario": {"name": "natural", "roles_per_client": 3, "gap": 50},
        "federation": {"num_clients": 30}, "model": {"name": "char_lstm"},
        "note": "as n15-m7; model: CharLSTM"},
}

# the FMT-SVM paper: K = 5 clients, Dirichlet over the 3-class label (section 3.1.2), its
# encoder (section 2.5)
for _data, _short in (("pneumonia", "pneumonia"), ("breast_ultrasound", "ultrasound")):
    for _alpha in (0.3, 0.5, 0.9):
        PRESETS[f"fmtsvm-{_short}-a{_alpha}"] = {
            "dataset": {"name": _data},
            "scenario": {"name": "multitask_dirichlet", "alpha": _alpha},
            "federation": {"num_clients": 5},
            "model": {"name": "cnn", "channels": [16, 32], "features": 128},
            "note": "grey 1x64x64 input (the paper's encoder takes 3 channels); test share "
                    "25% of each client's samples (the paper's split is not stated)",
        }


def names() -> list[str]:
    return sorted(PRESETS)


def get(name: str) -> dict[str, Any]:
    """A deep copy of the preset's spec fields (without its ``note``)."""
    preset = copy.deepcopy(PRESETS[name])
    preset.pop("note", None)
    return preset


def merge_under(base: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` over ``base``: mappings merge recursively, anything else in ``spec`` wins; a
    component the spec renames (another ``name``) replaces the preset's whole mapping, so the
    preset's parameters never leak into a different scenario or model."""
    out = dict(base)
    for key, value in spec.items():
        old = out.get(key)
        if isinstance(value, dict) and isinstance(old, dict) and \
                value.get("name", old.get("name")) == old.get("name"):
            out[key] = merge_under(old, value)
        else:
            out[key] = value
    return out
