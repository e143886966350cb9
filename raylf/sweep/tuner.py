"""One stage of a sweep as a Tune experiment: run it, or resume it where it stopped.

The trainable is ``raylf.sweep.trial.run_trial`` in its placement group, the console
``raylf.sweep.console.SweepConsole``; both are pickled by reference to those modules, which a Ray
worker imports."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from ray import tune

from raylf import checkpoints
from raylf.sweep.console import SweepConsole, make_active
from raylf.sweep.placement import trial_bundles
from raylf.sweep.spec import SweepSpec
from raylf.sweep.trial import SharedStage, finished_rows, run_trial
from raylf.sweep.trial_logs import EndedTrials, TrialLogs


class Interrupted(RuntimeError):
    """Tune returned before every trial of a stage ended (Ctrl-C): nothing after it may run."""


class OfRunningStage:
    """Something Tune asks the driver per trial, answered from the stage this process runs.

    Tune pickles these callables: the names into every trial's saved state and into the tuner
    it saves, the resources with the trainable, which it unpickles from Ray's registry for each
    new trial. They pickle as a reference and unpickle as the same callable of the stage the
    unpickling process runs, as the console does (None where none runs: a trial's process,
    Tune's saved trials read for analysis; neither calls them). Pickled with the stage inside,
    each held every trial's spec: the experiment state Tune rewrites as trials end grew with the
    square of the trials (1.8 GB for 1,200), and so did the driver's time to start each one."""

    def __init__(self, stage):
        self.stage = stage

    def __reduce__(self):
        return (of_running_stage, (type(self),))


class TrialNames(OfRunningStage):
    """Tune's name and folder of a trial: the raylf trial id its config stands for, or its
    group's name (``run_trial`` finds its Tune checkpoints in ``<stage.path>/<name>``)."""

    def __call__(self, tune_trial) -> str:
        return self.stage.trial_id(tune_trial.config)


class TrialResources(OfRunningStage):
    """The placement group of a trial: its bundles (``raylf.sweep.placement.trial_bundles``;
    a group's trials all ask for the same)."""

    def __call__(self, config) -> tune.PlacementGroupFactory:
        return tune.PlacementGroupFactory(trial_bundles(self.stage.members(config)[0].spec),
                                          strategy="PACK")


_running: list = []  # the stage this process runs


def of_running_stage(kind: type[OfRunningStage]) -> OfRunningStage | None:
    return kind(_running[-1]) if _running else None


def already_finished(stage) -> dict[str, int]:
    """Trial id → rounds of the stage's trials whose tables say they ended for good."""
    return {r["trial_id"]: r["federation.rounds"] for r in finished_rows(stage.root)
            if stage.owns(r)}


@dataclass(frozen=True)
class Ended:
    """What the sweep keeps of a Tune trial once its experiment returns (Tune's result also
    holds a data frame of every report, which thousands of trials would keep in memory)."""

    config: dict[str, Any]
    error: Exception | None


def run_stage(stage, *, sweep: SweepSpec, max_concurrent: int, verbose: bool = False,
              trackers: list[tune.Callback] = ()) -> list[Ended]:
    """Run (or resume) a stage of the sweep: its Tune experiments one after the other
    (``stage.experiments()``: one, or parts of a large grid). Each trial's config and reports
    are in the tables; Tune's JSON record of each, TensorBoard and the trackers only with
    ``--log``."""
    console = SweepConsole(stage)
    _running[:] = [stage]
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"  # objectives: evaluation rounds only
    if not verbose:  # Tune's newer output engine prints its start block even at verbose=0
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # The end of Tune's fit reads every trial's result.json into frames raylf never uses, and
    # warns of each trial without one, which is every trial unless --log json writes them (the
    # tables hold the results): one line per trial, 10,000 in a large sweep.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    make_active(None if verbose else console)
    console.start(already_finished(stage))
    # the console first: on a failed trial it probes the storage and stops the sweep if that
    # is down, before anything else writes there
    callbacks = [*([] if verbose else [console]), EndedTrials(), *trackers]
    ended: list[Ended] = []
    try:
        for experiment in stage.experiments():
            ended += _fit(experiment, sweep=sweep, max_concurrent=max_concurrent,
                          shown=verbose or any(not isinstance(t, TrialLogs) for t in trackers),
                          callbacks=callbacks,
                          verbose=verbose)
    except tune.TuneError:  # how Tune passes on the console's StorageUnwritable
        if console.storage_error is None:
            raise
        raise console.storage_error from None
    finally:
        console.finish()
    return ended


def _fit(stage, *, sweep: SweepSpec, max_concurrent: int, shown: bool,
         callbacks: list[tune.Callback], verbose: bool) -> list[Ended]:
    """Run (or resume) one Tune experiment."""
    names = TrialNames(stage)
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, stage=SharedStage.of(stage),
                             checkpoint_every=sweep.checkpoint_every,
                             checkpoint_min_s=sweep.checkpoint_min_s,
                             report_min_s=sweep.report_min_s,
                             shown=shown,  # what shows every report: trackers, Tune's table
                             keep_final_states=tuple(sweep.keep_final_states)),
        TrialResources(stage))
    run_config = tune.RunConfig(
        name=stage.name, storage_path=stage.storage_path,
        failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=checkpoints.CHECKPOINTS_KEPT),
        callbacks=callbacks, verbose=None if verbose else 0)
    space, search = stage.tune_setup(max_concurrent)
    if tune.Tuner.can_restore(stage.path):
        # The space again: Tune does not keep it, and starts afresh from it when the driver died
        # after saving the tuner but before the first experiment state.
        tuner = tune.Tuner.restore(stage.path, trainable=trainable, param_space=space,
                                   resume_errored=True)
    else:
        tuner = tune.Tuner(
            trainable, param_space=space,
            tune_config=tune.TuneConfig(
                # A trial's process is kept for the next trial of the same resources: each new
                # one costs ~5 CPU-s of imports (torch, Tune, raylf), the bulk of a tiny trial.
                reuse_actors=True,
                trial_name_creator=names, trial_dirname_creator=names, **search),
            run_config=run_config)
    grid = tuner.fit()
    if grid.num_terminated + grid.num_errors < stage.tune_trials:
        raise Interrupted(f"{stage.tune_trials - grid.num_terminated - grid.num_errors} Tune "
                          f"trial(s) of {stage.path} did not end")
    return [Ended(result.config, result.error) for result in grid]
