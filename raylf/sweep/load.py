"""What a sweep command runs: its spec file loaded into trials (and search searches and probes), or
several spec files' distinct configurations turned into a smoke or estimate run."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raylf.errors import SpecError
from raylf.sweep import estimate, smoke
from raylf.sweep.spec import SweepSpec, Trial, load_sweep, searched_methods


@dataclass
class Loaded:
    """What the driver runs: the sweep, its trials (and search searches and probes); for a smoke or
    estimate run the derived sweep and ``mode``'s trials, the spec's own kept in ``original``."""

    sweep: SweepSpec
    trials: list[Trial]
    searches: list
    probes: list[Trial]
    mode: Any = None  # SmokeRun | TimingRun
    original: tuple | None = None  # (sweep, trials, searches, probes) the mode was derived from


def load_specs(args: argparse.Namespace, overrides: list[str]) -> Loaded:
    """One spec as it is; with ``--smoke`` / ``--estimate`` every distinct configuration of
    every spec given, shrunk (raylf.sweep.smoke) or cut to a few timed rounds
    (raylf.sweep.estimate)."""
    if args.smoke and args.estimate:
        raise SpecError([("--estimate", "give --smoke or --estimate, not both")])
    if args.estimate_budget is not None and not args.estimate:
        raise SpecError([("--estimate-budget", "it sets how many trials --estimate times: "
                                               "give --estimate with it")])
    if len(args.spec) > 1 and not (args.smoke or args.dry_run):
        raise SpecError([("spec", f"{len(args.spec)} spec files given; several are planned or "
                                  "smoke-run together (--dry-run, --smoke), one is run")])
    loaded = []
    for path in args.spec:
        sweep, trials = load_sweep(path, overrides)
        searches, probes = searched_methods(sweep, Path(path).parent, path) if sweep.searched \
            else ([], [])
        loaded.append((sweep, trials, searches, probes))
    everything = [t for one in loaded for t in one[1] + one[3]]
    if args.smoke:
        if args.smoke_rounds < 1:
            raise SpecError([("--smoke-rounds", "give at least 1 round")])
        # a searched method is smoke-run at its probes: every end of its space, every choice
        mode = smoke.smoke_run(everything, args.smoke_rounds, paths=args.smoke_paths)
        name = args.name or (f"{loaded[0][0].name}-smoke" if len(loaded) == 1 else "smoke")
    elif args.estimate:
        if args.estimate_rounds < 1:
            raise SpecError([("--estimate-rounds", "give at least 1 round")])
        if args.estimate_budget is not None and args.estimate_budget < 1:
            raise SpecError([("--estimate-budget", "give at least 1 timing trial")])
        mode = estimate.timing_run(everything, args.estimate_rounds, args.estimate_budget,
                             standins=not args.dry_run)
        name = args.name or f"{loaded[0][0].name}-estimate"
    elif len(loaded) == 1:
        return Loaded(*loaded[0])
    else:
        return Loaded(loaded[0][0], everything, [], [])
    # an estimate times its trials as many at once as the sweep would run them: on a machine
    # they share, neighbours slow a trial down, and that is part of what is estimated
    derived = SweepSpec(name=name, experiment={}, seeds=[0], max_failures=0,
                        max_concurrent=args.max_concurrent or (loaded[0][0].max_concurrent
                                                               if args.estimate else None))
    return Loaded(derived, mode.trials, [], [], mode, loaded[0])
