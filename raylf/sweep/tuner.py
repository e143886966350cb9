"""One stage of a sweep as a Tune experiment: run it, or resume it where it stopped.

The trainable is ``raylf.sweep.trial.run_trial`` in its placement group, the console
``raylf.sweep.console.SweepConsole``; both are pickled by reference to those modules, which a Ray
worker imports."""

from __future__ import annotations

import os

from ray import tune

from raylf import checkpoints, results
from raylf.sweep.console import SweepConsole, make_active
from raylf.sweep.placement import trial_bundles
from raylf.sweep.spec import SweepSpec
from raylf.sweep.trial import finished_row, run_trial


class Interrupted(RuntimeError):
    """Tune returned before every trial of a stage ended (Ctrl-C): nothing after it may run."""


def already_finished(stage) -> dict[str, int]:
    """Trial id → rounds of the stage's trials whose tables say they ended for good."""
    table = results.read_table(stage.root, "trials")
    rows = table.to_pylist() if table is not None else []
    return {r["trial_id"]: r["federation.rounds"] for r in rows
            if stage.owns(r) and finished_row(stage.root, r["trial_id"]) is not None}


def run_stage(stage, *, sweep: SweepSpec, max_concurrent: int, verbose: bool = False,
              trackers: list[tune.Callback] = ()) -> tune.ResultGrid:
    """Run (or resume) one Tune experiment of the sweep.
    Tune's CSV and JSON results are kept; TensorBoard and the trackers only with ``--log``."""
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    console = SweepConsole(stage)
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, stage=stage, checkpoint_every=sweep.checkpoint_every,
                             checkpoint_min_s=sweep.checkpoint_min_s,
                             report_min_s=sweep.report_min_s,
                             # what shows every evaluation: the trackers, Tune's progress table
                             report_evaluations=bool(trackers) or verbose,
                             keep_final_states=tuple(sweep.keep_final_states)),
        lambda config: tune.PlacementGroupFactory(
            trial_bundles(stage.trial(config).spec), strategy="PACK"))
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"  # objectives: evaluation rounds only
    run_config = tune.RunConfig(
        name=stage.name, storage_path=stage.storage_path,
        failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=checkpoints.CHECKPOINTS_KEPT),
        callbacks=[CSVLoggerCallback(), JsonLoggerCallback(), *trackers,
                   *([] if verbose else [console])],
        verbose=None if verbose else 0)
    make_active(None if verbose else console)
    if not verbose:  # Tune's newer output engine prints its start block even at verbose=0
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
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
                trial_name_creator=lambda t: stage.trial(t.config).trial_id,
                # run_trial finds its Tune checkpoints in <stage.path>/<trial_id>
                trial_dirname_creator=lambda t: stage.trial(t.config).trial_id, **search),
            run_config=run_config)
    console.start(already_finished(stage))
    try:
        grid = tuner.fit()
    except tune.TuneError:  # how Tune passes on the console's StorageUnwritable
        if console.storage_error is None:
            raise
        raise console.storage_error from None
    finally:
        console.finish()
    if grid.num_terminated + grid.num_errors < stage.planned:
        raise Interrupted(f"{stage.planned - grid.num_terminated - grid.num_errors} trial(s) of "
                          f"{stage.path} did not end")
    return grid
