"""Tune's staging folder of each trial in the driver removed once the trial ended, if empty
(``EndedTrials``, always); and under ``--log json`` Tune's record of each trial,
``params.json`` (its config) and ``result.json`` (one JSON line per report to Tune, as Tune's
JSON logger writes them) in the trial's Tune folder, each written to the sweep's storage once
an attempt ends (``TrialLogs``).

The record is off by default: the trials and rounds tables hold the config and every round,
and the two files would be two more objects per trial in the storage (five where the tables
are three).

Tune's own logger callbacks write these files into the driver's staging folder, and Tune copies
that whole folder to the storage at every experiment snapshot: every trial's files again at
each one, so a sweep's uploads grew with the square of its trials (at 400 trials each trial's
files had been written 8 times). Written straight to the storage they are written once.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from ray import tune
from ray.tune.utils.util import SafeFallbackEncoder

from raylf.storage import create_folder

PARAMS, RESULTS = "params.json", "result.json"
logger = logging.getLogger(__name__)


class EndedTrials(tune.Callback):
    """Drops the staging folder of each trial that ended (``_drop_staging_folder``)."""

    def on_trial_complete(self, iteration, trials, trial, **info):
        _drop_staging_folder(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        _drop_staging_folder(trial)


class TrialLogs(EndedTrials):
    """Keeps each running trial's reports; when an attempt ends (finished, failed, retried)
    writes its config and every report so far to the trial's Tune folder in the storage
    (through Tune's own view of that storage, so local and object storage alike)."""

    def __init__(self):
        self._lines: dict[str, list[str]] = {}  # Tune's trial id → this attempt's reports
        self._written: dict[str, str] = {}  # Tune's trial id → result.json as last written

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._lines.setdefault(trial.trial_id, []).append(
            json.dumps(result, cls=SafeFallbackEncoder))

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._write(trial, final=True)
        super().on_trial_complete(iteration, trials, trial, **info)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._write(trial, final=True)
        super().on_trial_error(iteration, trials, trial, **info)

    def on_trial_recover(self, iteration, trials, trial, **info):
        self._write(trial, final=False)

    def _write(self, trial, final: bool) -> None:
        """A storage that fails the write (an outage) fails no trial: the reports wait for the
        trial's next end, as Tune's own uploads retry at its next snapshot (the sweep's console
        tells the user about the storage)."""
        fs, folder = trial.storage.storage_filesystem, trial.storage.trial_fs_path
        lines = self._lines.pop(trial.trial_id, [])
        try:
            if trial.trial_id not in self._written:  # the first end in this process
                _put(fs, f"{folder}/{PARAMS}", json.dumps(
                    trial.config, indent=2, sort_keys=True, cls=SafeFallbackEncoder))
                before = _get(fs, f"{folder}/{RESULTS}")  # a resumed sweep's earlier attempts
            else:
                before = self._written[trial.trial_id]
            text = before + "".join(line + "\n" for line in lines)
            _put(fs, f"{folder}/{RESULTS}", text)
        except OSError as err:
            if not final:
                self._lines[trial.trial_id] = lines + self._lines.get(trial.trial_id, [])
            logger.warning("Tune's log of trial %s not written: %s", trial, err)
            return
        finally:
            if final:
                self._written.pop(trial.trial_id, None)
        if not final:
            self._written[trial.trial_id] = text


def _drop_staging_folder(trial) -> None:
    """Tune's staging folder of an ended trial in the driver, if it is empty (it holds Tune's
    error files if the trial failed). Tune uploads its whole staging folder at each snapshot of
    the experiment, and an object store writes a marker object for every folder in it each
    time: one for every trial so far, at every snapshot."""
    try:
        os.rmdir(trial.local_path)
    except OSError:  # not empty, or gone
        pass


def _put(fs: Any, path: str, text: str) -> None:
    create_folder(fs, path.rsplit("/", 1)[0])
    with fs.open_output_stream(path) as out:
        out.write(text.encode())


def _get(fs: Any, path: str) -> str:
    try:
        with fs.open_input_stream(path) as stream:
            return stream.read().decode()
    except FileNotFoundError:
        return ""
