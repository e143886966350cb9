"""Is a run learning? Dead ReLU units in the encoders, and accuracy stuck at the majority rate.

A run can train without error and learn nothing: FMT-SVM with summed hinges on a 10-class task
kept a flat loss and every task at chance for all its rounds. Two method-independent signals
make that visible: per evaluation round, the fraction of the trained encoders' ReLU units that
output 0 on a probe batch (``dead_relu_fraction`` in the rounds table), and the majority-class
rate each client's test split gives a constant predictor (``majority_rate`` per
clients row, its mean over clients per task in the rounds table). When every task's mean client
accuracy stays at or below that rate for ``STUCK_ROUNDS`` evaluation rounds in a row, the trials
row gets a ``warning``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

PROBE_SAMPLES = 32  # training samples of a client the probe forward pass sees
STUCK_ROUNDS = 3
TOLERANCE = 0.01  # accuracy up to the majority rate + this counts as "at the majority rate"
RECTIFIERS = (nn.ReLU, nn.ReLU6)


@torch.no_grad()
def dead_relu_fraction(encoder: nn.Module, x: torch.Tensor) -> float | None:
    """Fraction of the encoder's ReLU units that output 0 for every sample of ``x``.

    A unit is a channel of a convolutional activation (N×C×…) or a feature of a dense one
    (N×F); a module applied twice (torchvision's blocks) counts once per call. Run in eval
    mode, so nothing (BatchNorm statistics) changes. None when the encoder has no ReLU.
    """
    if len(x) == 0:
        return None
    training = encoder.training
    try:
        encoder.eval()
        return dead_relu_fractions(encoder, lambda: encoder(x))[0]
    finally:
        encoder.train(training)


@torch.no_grad()
def dead_relu_fractions(encoder: nn.Module, forward: Callable[[], Any],
                        clients: int = 0) -> list[float | None]:
    """``dead_relu_fraction`` of each client while ``forward()`` runs ``encoder``'s rectifiers:
    with ``clients`` > 0 their outputs lead with a client dimension (a cohort's batched forward,
    clients × N × C × …), so one pass probes every client of a cohort; else one model's."""
    dead = torch.zeros(max(clients, 1), dtype=torch.long)
    units = 0

    def count(module, inputs, output):
        nonlocal dead, units
        out = output.detach() if clients else output.detach().unsqueeze(0)
        # rectified outputs are ≥ 0: a unit is alive where its largest output is positive
        alive = out.amax(dim=(1, *range(3, out.dim()))) > 0  # clients × units
        dead = dead + (~alive).sum(1).cpu()
        units += alive.shape[1]

    hooks = [m.register_forward_hook(count) for m in encoder.modules()
             if isinstance(m, RECTIFIERS)]
    try:
        forward()
    finally:
        for hook in hooks:
            hook.remove()
    return [float(d) / units if units else None for d in dead.tolist()]


def majority_rate(labels: torch.Tensor) -> float | None:
    """Accuracy of always predicting the most frequent label (None for no labels)."""
    if len(labels) == 0:
        return None
    return float(torch.bincount(labels).max()) / len(labels)


def majority_columns(rows: list[dict[str, Any]], primary: str) -> dict[str, float]:
    """Rounds-table columns ``majority_rate`` / ``majority_rate_<task>``: the mean over clients
    of the majority rate on the test split, beside the reported model's ``acc_mean``…"""
    rates: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        if (row.get("split", "test") == "test" and row.get("deployable", primary) == primary
                and row.get("majority_rate") is not None and row.get("accuracy") is not None):
            rates[row["task"]].append(row["majority_rate"])
    return {"majority_rate" + ("" if task == "main" else f"_{task}"): float(np.mean(values))
            for task, values in sorted(rates.items())}


def not_learning(rounds: list[dict[str, Any]]) -> str | None:
    """The trials row's ``warning``: None, or which evaluation rounds had every task's mean
    client accuracy at (or below) its majority-class rate ``STUCK_ROUNDS`` times in a row."""
    streak: list[dict[str, Any]] = []
    for record in rounds:
        tasks = {key.removeprefix("majority_rate"): rate for key, rate in record.items()
                 if key.startswith("majority_rate") and rate is not None}
        if not tasks:
            continue  # not an evaluation round
        stuck = all(record.get(f"acc_mean{task}") is not None
                    and record[f"acc_mean{task}"] <= rate + TOLERANCE
                    for task, rate in tasks.items())
        streak = [*streak, record] if stuck else []
        if len(streak) == STUCK_ROUNDS:
            break
    else:
        return None
    last = streak[-1]
    tasks = ", ".join(f"{task.removeprefix('_') or 'main'} {last[f'acc_mean{task}']:.3f} vs "
                      f"{last[f'majority_rate{task}']:.3f}"
                      for task in sorted(k.removeprefix("majority_rate") for k in last
                                         if k.startswith("majority_rate")))
    dead = last.get("dead_relu_fraction")
    units = f"; dead ReLU units in the encoders: {dead:.0%}" if dead is not None else ""
    rounds_seen = ", ".join(str(r["round"]) for r in streak)
    return (f"not learning: every task's mean client accuracy sat at its majority-class rate in "
            f"evaluation rounds {rounds_seen} (round {last['round']}: {tasks}){units}; check "
            "federation.optimizer.lr, the method's loss scale and dataset.normalize")
