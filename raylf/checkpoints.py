"""A trial's checkpoints: where they are written, how many are kept while it runs, and what goes
once it has ended for good.

A sweep trial checkpoints in two places: Tune's checkpoint (``progress.json`` and the runtime's
``state.pt``, in Tune's trial folder ``<experiment>/<trial_id>/checkpoint_<n>/``), and the
personal state that each client worker writes itself (``<root>/checkpoints/<trial_id>/round-<r>/``),
which ``state.pt`` names. Only a resume of the trial reads them, and a trial whose tables record
an end for good is never resumed (``raylf.sweep.trial.finished_row``), so then they go
(:func:`drop_resume_state`): a paper-scale trial's personal states are hundreds of MB (VGG16 for
10 clients: 860 MB). Kept only when asked for: the latest personal state of a trial whose
method the sweep lists in ``keep_final_states`` (the donor-swap study reads it).
"""

from __future__ import annotations

import re
import shutil
import tempfile

import pyarrow.fs as pafs

from raylf import results

# Tune keeps this many checkpoints of a trial, and forces an experiment-state snapshot once a
# trial has saved as many since the last one, so a resume restores one of them; with
# checkpoint_min_s between checkpoints that stays rarer than Tune's own periodic snapshot.
CHECKPOINTS_KEPT = 3


class CheckpointFolders:
    """Where workers write personal state for the checkpoint after round r:
    ``<out>/checkpoints/<trial_id>/round-<r>`` (a temporary folder without ``out``).

    A resumed sweep restores the checkpoint its last experiment snapshot names, which may be the
    oldest one Tune still keeps, so its folder must outlive it: the trial removes a folder as
    soon as it reports, before Tune's driver has taken that report and deleted its own oldest
    checkpoint, hence one folder more than Tune keeps."""

    KEEP = CHECKPOINTS_KEPT + 1

    def __init__(self, out: str | None, trial_id: str):
        self._temp = None if out is not None else tempfile.mkdtemp(prefix="raylf-ckpt-")
        self.root = f"{out if out is not None else self._temp}/checkpoints/{trial_id}"
        self._reported: list[int] = []

    def folder(self, rnd: int) -> str:
        return f"{self.root}/round-{rnd}"

    def reported(self, rnd: int) -> None:
        self._reported.append(rnd)
        fs, _ = results.filesystem(self.root)
        for old in self._reported[: -self.KEEP]:
            _, path = results.filesystem(self.folder(old))
            if fs.get_file_info(path).type != pafs.FileType.NotFound:
                fs.delete_dir(path)
        self._reported = self._reported[-self.KEEP:]

    def drop(self, keep_latest: bool) -> None:
        """Remove the trial's personal-state folders: all of them, or all but the latest
        round's (the final states kept for a study)."""
        fs, base = results.filesystem(self.root)
        found = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
        rounds = sorted((int(m.group(1)), info.path) for info in found
                        if (m := re.fullmatch(r"round-(\d+)", info.base_name)))
        if keep_latest and rounds:
            for _, path in rounds[:-1]:
                fs.delete_dir(path)
        elif fs.get_file_info(base).type != pafs.FileType.NotFound:
            fs.delete_dir(base)

    def close(self) -> None:
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)


def empty_tune_checkpoints(trial_dir: str) -> None:
    """Delete the files of every Tune checkpoint in Tune's folder of a trial, keeping the
    (empty) ``checkpoint_<n>`` folders themselves: Tune refuses to restore a trial whose
    recorded checkpoint folder is gone, and a driver killed before Tune saved this trial's end
    restores it from there on the next run (the trial then finds its tables and only reports
    them)."""
    fs, base = results.filesystem(trial_dir)
    for info in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)):
        if info.type == pafs.FileType.Directory and info.base_name.startswith("checkpoint_"):
            fs.delete_dir_contents(info.path)


def drop_resume_state(root: str, trial_id: str, tune_trial_dir: str,
                      keep_final_states: bool) -> None:
    """What only a resume of the trial could read, once its tables record an end for good: its
    personal-state folders under ``root`` (but the latest with ``keep_final_states``) and the
    payload of its Tune checkpoints. A kill half-way leaves garbage, never a broken sweep: Tune
    had not seen the trial end, so the next run starts it again, and it drops the rest."""
    CheckpointFolders(root, trial_id).drop(keep_latest=keep_final_states)
    empty_tune_checkpoints(tune_trial_dir)
