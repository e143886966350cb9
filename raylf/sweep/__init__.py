"""``python -m raylf.sweep SPEC.yaml``: a grid of experiments × seeds on Ray Tune, or a search
on validation data followed by the chosen points × seeds (``raylf.sweep.stages``).

Each trial is a Tune function trial that reserves one placement-group bundle for itself, one for
the coordinator and one per client worker; it reports its rounds to Tune (every evaluation, the
others at most once per ``report_min_s``), checkpoints every ``checkpoint_every`` rounds (at most
once per ``checkpoint_min_s``), and writes its own rows of the Arrow tables under
``<storage>/<name>/tables/``; once they record its end, it drops its checkpoints
(``raylf.checkpoints``). A sweep directory that already exists is resumed (finished
trials are kept, unfinished ones continue from their last checkpoint), by one driver at a time
(``raylf.sweep.lease``).

The console shows the plan, one line per finished trial and a progress line with an ETA, then
the leaderboard; ``--verbose`` shows Tune's own tables instead.

Exit codes: 0 every trial finished (ok, diverged, timeout or stopped by ASHA), 1 some trial
failed after its retries or the storage stopped accepting writes, 2 invalid sweep spec, data,
storage or resources the cluster can never provide, or a sweep directory another driver runs
(nothing ran), 130 interrupted (run it again to resume).
"""
