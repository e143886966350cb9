"""``--log``: Tune's own logger callbacks for TensorBoard, MLflow and W&B, each writing offline
under the sweep directory, next to the tables; and Tune's JSON record of each trial
(``raylf.sweep.trial_logs.TrialLogs``)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ray import tune

from raylf.errors import SpecError
from raylf.sweep.trial_logs import TrialLogs

TRACKERS = {  # --log NAME: (module Tune's callback needs, extra that installs it)
    "json": (None, None), "tensorboard": ("tensorboardX", "ray[tune]"),
    "mlflow": ("mlflow", "raylf[mlflow]"), "wandb": ("wandb", "raylf[wandb]")}


def tracker_callbacks(names: list[str], root: str, sweep: str) -> list[tune.Callback]:
    """Tune's own logger callbacks for ``--log`` (trackers write offline, next to the tables)."""
    missing = [(n, TRACKERS[n]) for n in names
               if TRACKERS[n][0] and importlib.util.find_spec(TRACKERS[n][0]) is None]
    if missing:
        raise SpecError([("--log", f"{name} needs the {module} package; pip install "
                                   f"'{extra}' (or leave out --log {name})")
                         for name, (module, extra) in missing])
    callbacks: list[tune.Callback] = []
    if "json" in names:
        callbacks.append(TrialLogs())
    if "tensorboard" in names:
        from ray.tune.logger import TBXLoggerCallback

        callbacks.append(TBXLoggerCallback())
    local = "://" not in root
    if "mlflow" in names:
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        uri = Path(root, "mlruns").as_uri() if local else None
        callbacks.append(MLflowLoggerCallback(tracking_uri=uri, experiment_name=sweep))
    if "wandb" in names:
        from ray.air.integrations.wandb import WandbLoggerCallback

        os.environ.setdefault("WANDB_MODE", "offline")
        callbacks.append(WandbLoggerCallback(project=sweep, mode=os.environ["WANDB_MODE"],
                                             dir=root if local else None))
    return callbacks
