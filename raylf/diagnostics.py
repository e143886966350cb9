"""Analyses that need a run's final client models, not only its tables.

``python -m raylf.diagnostics donor-swap RUN_DIR`` is HDC-FL's donor-compatibility study (the
HDC-FL paper's Tables 4, 14 and 15): for every target client k and donor j ≠ k it evaluates
(φ_j, h_k) on k's test split. The benefit of a donor is loss(φ_k, h_k) − loss(φ_j, h_k); head
similarity is minus the distance between the clients' head descriptors (low-rank and raw). Per
target it records Spearman ρ (similarity vs benefit), AUROC and average precision of similarity
for "beneficial donor", the beneficial-donor rate, the accuracy gain of the nearest-head donor
minus that of a random one, and the mean accuracy gain per head-distance quintile.

The clients' encoders and heads come from the last checkpoint of each trial
(``RUN_DIR/checkpoints/<trial>/round-<r>/worker-*.pt``: a sweep checkpoints the final round and
keeps it for the methods its ``keep_final_states`` lists), for methods whose personal state holds
both (``hdcfl``). Rows go to
``RUN_DIR/tables/donor_swap/<trial>.parquet``, one per trial × descriptor × target.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import sys
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import torch
from scipy.stats import spearmanr
from sklearn.metrics import average_precision_score, roc_auc_score

from raylf import results
from raylf.config import validate
from raylf.errors import SpecError
from raylf.methods.base import score
from raylf.methods.hdcfl import head_descriptors

TABLE = "donor_swap"
QUINTILES = 5
STATS = ("spearman_loss", "auroc_loss", "ap", "beneficial_rate", "ap_lift", "top1_minus_random")


def last_checkpoint(root: str, trial_id: str) -> str | None:
    """The folder of a trial's latest checkpoint, or None when it has none."""
    fs, base = results.filesystem(root)
    selector = pafs.FileSelector(f"{base}/checkpoints/{trial_id}", allow_not_found=True)
    rounds = [int(m.group(1)) for info in fs.get_file_info(selector)
              if (m := re.fullmatch(r"round-(\d+)", info.base_name))]
    return f"{base}/checkpoints/{trial_id}/round-{max(rounds)}" if rounds else None


def personal_states(folder: str) -> dict[int, Any]:
    fs, path = results.filesystem(folder)
    states: dict[int, Any] = {}
    for info in fs.get_file_info(pafs.FileSelector(path)):
        if info.base_name.startswith("worker-") and info.base_name.endswith(".pt"):
            with fs.open_input_stream(info.path) as source:
                states.update(torch.load(io.BytesIO(source.read()), weights_only=True))
    return {int(c): s for c, s in states.items()}


def trial_config(root: str, trial_id: str) -> dict[str, Any]:
    """The full spec a trial ran, from its trials-table file's schema metadata."""
    fs, base = results.filesystem(root)
    schema = pq.read_schema(f"{base}/tables/trials/{trial_id}.parquet", filesystem=fs)
    return json.loads(schema.metadata[b"config"])


def swap_matrix(spec, encoders: dict[int, torch.Tensor], heads: dict[int, torch.Tensor],
                split: str = "test") -> tuple[np.ndarray, np.ndarray]:
    """loss[k, j] and accuracy[k, j] of (φ_j, h_k) on client k's ``split``."""
    from raylf.data import build_federation
    from raylf.runtime.blueprint import Blueprint

    blueprint = Blueprint(spec, build_federation(spec))
    device = torch.device("cpu")
    trainer = blueprint.trainer(device)
    ids = sorted(encoders)
    data = blueprint.federation.shard(np.asarray(ids), device)
    loss = np.zeros((len(ids), len(ids)))
    acc = np.zeros((len(ids), len(ids)))
    for a, k in enumerate(ids):
        client = data.client(k).evaluated_on(split)
        trainer.load(heads[k], "head")
        for b, j in enumerate(ids):
            trainer.load(encoders[j], "encoder")
            scored = score(trainer.predict(client.x_test), client.y_test)
            loss[a, b], acc[a, b] = scored["loss"], scored["accuracy"]
    return loss, acc


def target_stats(distance: np.ndarray, loss: np.ndarray, acc: np.ndarray,
                 k: int) -> dict[str, float]:
    """One target's donor-ranking statistics (accuracy gains in percentage points)."""
    donors = np.array([j for j in range(len(distance)) if j != k])
    similarity = -distance[k, donors]
    benefit = loss[k, k] - loss[k, donors]
    gain = 100.0 * (acc[k, donors] - acc[k, k])
    good = benefit > 0
    row = {"beneficial_rate": float(good.mean()),
           "spearman_loss": _spearman(similarity, benefit),
           "auroc_loss": float(roc_auc_score(good, similarity)) if 0 < good.sum() < len(good)
           else math.nan,
           "ap": float(average_precision_score(good, similarity)) if good.any() else math.nan,
           "top1_minus_random": float(gain[np.argmax(similarity)] - gain.mean())}
    row["ap_lift"] = row["ap"] - row["beneficial_rate"]
    by_distance = gain[np.argsort(-similarity, kind="stable")]
    for q, part in enumerate(np.array_split(by_distance, QUINTILES), start=1):
        row[f"gain_q{q}"] = float(part.mean()) if len(part) else math.nan
    row["gain_q1_minus_q5"] = row["gain_q1"] - row[f"gain_q{QUINTILES}"]
    return row


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(spearmanr(x, y).statistic)


def donor_swap_trial(root: str, trial_id: str, rank: int | None = None,
                     split: str = "test") -> list[dict[str, Any]]:
    """Rows of one trial (empty when it has no checkpoint with encoders and heads)."""
    folder = last_checkpoint(root, trial_id)
    if folder is None:
        return []
    states = personal_states(folder)
    trained = {c: s for c, s in states.items() if isinstance(s, dict) and
               {"encoder", "head"} <= s.keys() and s["encoder"].numel()}
    if len(trained) < 3:
        return []
    config = trial_config(root, trial_id)
    spec = validate(config)
    rank = rank or getattr(spec.method_params, "rank", 8)
    scenario = ", ".join(f"{k}={v}" for k, v in sorted(config["scenario"].items())
                         if k != "name")
    setting = f"{spec.dataset.name} {spec.scenario.name}({scenario}) {spec.model.name}"
    ids = sorted(trained)
    loss, acc = swap_matrix(spec, {c: trained[c]["encoder"] for c in ids},
                            {c: trained[c]["head"] for c in ids}, split)
    heads = torch.stack([trained[c]["head"] for c in ids])
    rows = []
    for descriptor, r in (("lowrank", rank), ("raw", None)):
        z = head_descriptors(heads, r)
        distance = np.linalg.norm(z[:, None] - z[None], axis=-1)
        for a, k in enumerate(ids):
            rows.append({"trial_id": trial_id, "setting": setting, "method": spec.method.name,
                         "seed": spec.seed, "round": int(folder.rsplit("-", 1)[1]),
                         "split": split, "descriptor": descriptor, "rank": r, "target": k,
                         "donors": len(ids) - 1, **target_stats(distance, loss, acc, a)})
    results.write_table(root, TABLE, trial_id, results.to_table(rows, results.provenance(config)))
    return rows


def summary(rows: pd.DataFrame) -> str:
    """Tables 4, 14 and 15 of the paper: means over target × seed units per setting."""
    lines = []
    for setting, part in rows.groupby("setting"):
        units = part.groupby("descriptor")
        lowrank = units.get_group("lowrank")
        lines.append(f"{setting}: {lowrank['seed'].nunique()} seed(s), "
                     f"{len(lowrank)} target x seed units")
        lines.append("  donor compatibility (low-rank, Table 4)")
        lines += [f"    {stat:<20} {lowrank[stat].mean():8.3f}" for stat in STATS]
        lines.append("  accuracy gain (pp) by head-distance quintile, Q1 closest (Table 14)")
        for q in [f"gain_q{i}" for i in range(1, QUINTILES + 1)] + ["gain_q1_minus_q5"]:
            values = lowrank[q].dropna()
            se = values.std(ddof=1) / math.sqrt(len(values)) if len(values) > 1 else math.nan
            lines.append(f"    {q:<20} {values.mean():8.3f} ± {se:.3f}")
        if "raw" in units.groups:
            raw = units.get_group("raw")
            lines.append("  low rank vs raw (Table 15)")
            for stat in ("spearman_loss", "auroc_loss"):
                a, b = lowrank[stat].mean(), raw[stat].mean()
                lines.append(f"    {stat:<20} low rank {a:.3f}  raw {b:.3f}  difference "
                             f"{a - b:+.3f}")
    return "\n".join(lines)


def donor_swap(root: str, trial_ids: list[str] | None = None, rank: int | None = None,
               split: str = "test") -> pd.DataFrame:
    trials = results.read_table(root, "trials")
    if trials is None:
        raise SpecError([("RUN_DIR", f"no trials table under {root}/tables/")])
    known = trials.column("trial_id").to_pylist()
    for wanted in trial_ids or []:
        if wanted not in known:
            raise SpecError([("--trial", f"{wanted!r} is not a trial of {root}")])
    rows = [row for t in (trial_ids or known) for row in donor_swap_trial(root, t, rank, split)]
    if not rows:
        raise SpecError([("RUN_DIR", (
            f"no trial under {root} has a checkpoint with every client's encoder and head: run "
            "hdcfl through python -m raylf.sweep with keep_final_states: [hdcfl] in the sweep "
            "spec (or --set keep_final_states=[hdcfl]): it keeps the final round's under "
            "checkpoints/<trial>/round-<r>/"))])
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raylf.diagnostics", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    swap = commands.add_parser("donor-swap", help="donor-encoder swap study (HDC-FL Tables 4, "
                                                  "14, 15)")
    swap.add_argument("run_dir", help="a sweep or run directory (local path or URI)")
    swap.add_argument("--trial", action="append", help="only this trial id (repeatable)")
    swap.add_argument("--rank", type=int, help="low-rank descriptor rank (default: the trial's "
                                               "method.params.rank, else 8)")
    swap.add_argument("--split", choices=("test", "val"), default="test")
    args = parser.parse_args(argv)
    try:
        rows = donor_swap(args.run_dir, args.trial, args.rank, args.split)
    except SpecError as err:
        print(err, file=sys.stderr)
        return 2
    print(summary(rows))
    print(f"table: {args.run_dir}/tables/{TABLE}/ ({rows['trial_id'].nunique()} trial(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
