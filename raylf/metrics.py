"""Summary metrics over per-client accuracies, as the papers define them."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np

ACCURACY_COLUMNS = ("acc_mean", "acc_weighted", "acc_worst", "acc_bottom20", "acc_gap")


def evaluates(record: dict[str, Any]) -> bool:
    """Whether a round's record carries an evaluation (its accuracy columns)."""
    return any(k.startswith("acc_") for k in record)


def accuracy_summary(accuracy: np.ndarray, correct: np.ndarray, n: np.ndarray) -> dict[str, float]:
    """mean (unweighted over clients), weighted (Σcorrect/Σn), worst, bottom-20 %, gap."""
    acc = np.sort(np.asarray(accuracy, dtype=np.float64))
    bottom = acc[: max(1, math.ceil(0.2 * len(acc)))]
    return {
        "acc_mean": float(acc.mean()),
        "acc_weighted": float(np.sum(correct) / np.sum(n)),
        "acc_worst": float(acc[0]),
        "acc_bottom20": float(bottom.mean()),
        "acc_gap": float(acc[-1] - acc[0]),
    }


def summarize(rows: list[dict[str, Any]], primary: str = "main") -> dict[str, float]:
    """Round-level summary of clients-table rows per split, deployable and task.

    Test rows of the ``primary`` deployable's ``main`` task give ``acc_mean`` …; another task
    adds ``_<task>``, another deployable ``_<deployable>``, the validation split a ``val_``
    prefix (``val_acc_mean_binary_own_heads``).
    """
    by_key: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row.get("accuracy") is not None:
            key = (row.get("split", "test"), row.get("deployable", primary), row["task"])
            by_key[key].append(row)
    out: dict[str, float] = {}
    for (split, deployable, task), group in sorted(by_key.items()):
        prefix = "val_" if split == "val" else ""
        suffix = ("" if task == "main" else f"_{task}") + \
            ("" if deployable == primary else f"_{deployable}")
        summary = accuracy_summary(
            np.array([r["accuracy"] for r in group]),
            np.array([r["correct"] for r in group]),
            np.array([r["n_test"] for r in group]))
        summary["eval_loss"] = float(np.mean([r["loss"] for r in group]))
        summary.update(extra_means(group))
        out.update({f"{prefix}{k}{suffix}": v for k, v in summary.items()})
    return out


def of_reported_model(names: list[str]) -> list[str]:
    """Those of ``names`` (metrics of one kind: ``acc_mean``, ``acc_mean_binary``, …) that
    describe the reported deployable: a name that extends another present one by a suffix is a
    second deployable's (``acc_mean_shared``, ``acc_mean_binary_own_heads``, :func:`summarize`)."""
    return [n for n in names if not any(n.startswith(o + "_") for o in names if o != n)]


def extra_means(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean over clients of every ``auc*`` and ``accuracy_*`` column (auc → auc_mean,
    accuracy_own → acc_own_mean); clients whose value is null (a one-class split) are skipped."""
    out: dict[str, float] = {}
    for key in sorted({k for r in rows for k in r if k.startswith(("auc", "accuracy_"))}):
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            out[key.replace("accuracy", "acc") + "_mean"] = float(np.mean(values))
    return out
