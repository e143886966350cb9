"""What a sweep prints while Tune runs: a line per finished trial and the progress with an ETA.

Tune pickles its callbacks with the run config; the console unpickles as the console of the
process that restores it (``active_console``)."""

from __future__ import annotations

import sys
import time

from ray import tune

from raylf import metrics, results, storage
from raylf.sweep.search import objective_value
from raylf.sweep.spec import Trial
from raylf.sweep.trial import ENDED, MEMBER
from raylf.sweep.writable import StorageUnwritable, probe_storage


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def last_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


class SweepConsole(tune.Callback):
    """What the sweep prints while Tune runs: a line per finished trial and the progress.

    On a terminal the progress (done / running / pending, ETA) is one line kept at the bottom
    and status words are coloured; in a log each finished trial's line carries the progress,
    and there are no escape codes. The ETA extrapolates the rounds finished so far.
    """

    COLOURS = {"ok": "32", "diverged": "33", "timeout": "33", "stopped": "33", "failed": "31",
               "retry": "33"}

    def __init__(self, stage, stream=None):
        self.stage = stage
        self.root = stage.root
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        # Tune's trial id → the trials its config stands for (one, or a group's), while it
        # runs (a finished trial's spec is dropped: a sweep of many thousands would hold them
        # all)
        self.known: dict[str, list[Trial]] = {}
        self.failed_now: dict[str, list[tuple[Trial, str]]] = {}  # a group attempt's failures
        self.rounds: dict[str, int] = {}  # rounds done by trial
        self.rounds_done = 0  # their sum, kept as they change (the ETA of every line)
        self.total_rounds = stage.rounds or 1
        self.done: set[str] = set()
        self.running: set[str] = set()
        self.started = time.monotonic()
        self.rounds_at_start: int | None = None
        self.width = stage.width
        self.storage_error: StorageUnwritable | None = None

    def __reduce__(self):
        # Tune pickles its run config, callbacks included, to restore a sweep later; a console
        # belongs to one process's terminal, so it unpickles as the restoring process's console.
        return (active_console, ())

    def _members(self, tune_trial) -> list[Trial]:
        if tune_trial.trial_id not in self.known:
            self.known[tune_trial.trial_id] = self.stage.members(tune_trial.config)
        return self.known[tune_trial.trial_id]

    def _ended(self, tune_trial) -> list[Trial]:
        """The Tune trial's trials that have printed no line yet; it is forgotten."""
        members = self._members(tune_trial)
        del self.known[tune_trial.trial_id]
        self.failed_now.pop(tune_trial.trial_id, None)
        return [t for t in members if t.trial_id not in self.done]

    # Tune callback hooks
    def on_trial_start(self, iteration, trials, trial, **info):
        self._next_running(trial)
        self._progress()

    def _next_running(self, tune_trial) -> None:
        """The Tune trial's next trial without a line runs now (a group's run in turn)."""
        failed = {t.trial_id for t, _ in self.failed_now.get(tune_trial.trial_id, [])}
        waiting = [t for t in self._members(tune_trial)
                   if t.trial_id not in self.done and t.trial_id not in failed]
        if waiting:
            self.running.add(waiting[0].trial_id)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        members = self._members(trial)
        if len(members) == 1:
            self._rounds(members[0].trial_id, int(result.get("round", 0)))
            self._progress()
            return
        # a group's: the trials that ended since its last report, then the one it names (its
        # rounds, or its failure in this attempt)
        by_id = {t.trial_id: t for t in members}
        for trial_id in result.get(ENDED, ()):
            self._finished(by_id[trial_id], None)
        member = by_id.get(result.get(MEMBER))
        if member is not None and "trial_failed" in result:  # a retry or failed line follows
            self.running.discard(member.trial_id)
            self.failed_now.setdefault(trial.trial_id, []).append(
                (member, last_line(result["trial_failed"])))
        elif member is not None:
            self._rounds(member.trial_id, int(result.get("round", 0)))
        self.running -= set(by_id)
        self._next_running(trial)
        self._progress()

    def on_trial_complete(self, iteration, trials, trial, **info):
        for member in self._ended(trial):
            self._finished(member, None)

    def on_trial_recover(self, iteration, trials, trial, **info):
        reason = last_line(storage.trial_error(trial)) or (
            "Tune reported no error: the trial's process or its node was lost")
        failures = self.failed_now.pop(trial.trial_id, None) or [
            (next(t for t in self._members(trial) if t.trial_id not in self.done), reason)]
        for member, why in failures:
            self._line("retry", member, f"attempt failed: {why}")

    def on_trial_error(self, iteration, trials, trial, **info):
        try:
            probe_storage(self.root)
        except OSError as err:  # every further trial would fail the same way: stop here
            self.storage_error = StorageUnwritable(f"cannot write to {self.root}: {err}")
            raise self.storage_error from None
        for member in self._ended(trial):
            self._finished(member, last_line(storage.trial_error(trial)))

    def start(self, already_done: dict[str, int]) -> None:
        """``already_done``: trial id → rounds of the trials a resumed stage keeps."""
        self.done.update(already_done)
        for trial_id, rounds in already_done.items():
            self._rounds(trial_id, rounds)
        if already_done:
            self._print(f"resuming: {len(already_done)} of {self.stage.planned} trials already "
                        "finished")
        self.rounds_at_start = self.rounds_done

    def _rounds(self, trial_id: str, rounds: int) -> None:
        self.rounds_done += rounds - self.rounds.get(trial_id, 0)
        self.rounds[trial_id] = rounds

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()

    # rendering
    def _finished(self, trial: Trial, tune_error: str | None) -> None:
        trial_id = trial.trial_id
        self.done.add(trial_id)
        self.running.discard(trial_id)
        self._rounds(trial_id, trial.spec.federation.rounds)
        row = results.read_trial(self.root, trial_id) or {}
        if row.get("status") == results.STARTED:  # its process died before its end's row
            row = {}
        status = row.get("status") or "failed"
        if status == "ok" and self.stage.objective is not None:  # a search trial: validation
            value = objective_value(row, self.stage.objective)
            detail = f"{self.stage.objective} {'-' if value is None else format(value, '.4f')}"
        elif status == "ok":  # final mean and worst accuracy of the reported model (per task
            # for multi-task methods; a second deployable's are in the tables, not on the line)
            keys = [k for kind in ("acc_mean", "acc_worst") for k in metrics.of_reported_model(
                [k for k in row if (k == kind or k.startswith(kind + "_")) and "_at_" not in k
                 and row[k] is not None])]
            detail = "  ".join(f"{k} {'-' if row.get(k) is None else format(row[k], '.4f')}"
                               for k in keys)
        else:
            detail = last_line(row.get("error")) or tune_error or "no tables written"
        seconds = f"  {row['wall_s']:.1f}s" if row.get("wall_s") is not None else ""
        warning = f"  warning: {row['warning']}" if row.get("warning") else ""
        self._line(status, trial, f"{detail}{seconds}{warning}")

    def _line(self, status: str, trial: Trial, detail: str) -> None:
        word = f"{status:<8}"
        if self.tty:
            word = f"\033[{self.COLOURS.get(status, '0')}m{word}\033[0m"
        planned = self.stage.planned
        self.width = max(self.width, len(trial.label))
        count = f"[{len(self.done):>{len(str(planned))}}/{planned}]"
        text = f"{count} {word} {trial.label:<{self.width}}  {detail}"
        if not self.tty:
            text += f"  ({self._status()})"
        self._print(text)

    def _status(self) -> str:
        pending = max(0, self.stage.planned - len(self.done) - len(self.running))
        parts = [f"done {len(self.done)}/{self.stage.planned}", f"running {len(self.running)}",
                 f"pending {pending}"]
        eta = self._eta()
        if eta is not None:
            parts.append(f"ETA {duration(eta)}")
        return ", ".join(parts)

    def _eta(self) -> float | None:
        done = self.rounds_done
        gained = done - (self.rounds_at_start or 0)
        if gained <= 0 or done >= self.total_rounds:
            return None
        return (time.monotonic() - self.started) * (self.total_rounds - done) / gained

    def _print(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + text + "\n")
            self._progress()
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def _progress(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + self._status())
            self.stream.flush()


_consoles: list[SweepConsole] = []  # the console of the sweep this process is running


def active_console() -> tune.Callback:
    return _consoles[-1] if _consoles else tune.Callback()


def make_active(console: SweepConsole | None) -> None:
    """The console a restored run config's callback unpickles as (none: Tune's own output)."""
    _consoles[:] = [] if console is None else [console]
