"""``python -m raylf.report SWEEP_DIR [--out DIR] [--format md|html|latex] [--paper NAME]``,
or ``python -m raylf.report A B --diff``.

With ``--paper`` it writes that paper's scorecard (``raylf.report.scorecard``: its published
figures and claims against this sweep) instead of the report, into the same folder. With
``--diff`` it prints why two sweeps, experiments or trials (``DIR#TRIAL_ID``) are not the same
experiment: the resolved spec fields and the environment that differ (``raylf.report.diff``).

Exit codes: 0 written (or the diff printed), 2 no sweep at SWEEP_DIR, an unknown paper, a sweep
that holds nothing of the paper (nothing written), or ``--diff`` without two sides; 1 the
storage failed."""

from __future__ import annotations

import argparse
import sys

from raylf import results
from raylf.report import FORMATS, papers, write_report
from raylf.report.diff import render as render_diff
from raylf.report.scorecard import write_scorecard


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raylf.report", description=__doc__)
    parser.add_argument("sweep_dir", help="a sweep or experiment directory (path or s3://, gs://)")
    parser.add_argument("other", nargs="?",
                        help="with --diff: the second sweep, experiment or DIR#TRIAL_ID")
    parser.add_argument("--diff", action="store_true",
                        help="print the resolved fields and environment that differ between "
                             "SWEEP_DIR and OTHER (each a directory or DIR#TRIAL_ID)")
    parser.add_argument("--out", help="where to write the report (default SWEEP_DIR/report)")
    parser.add_argument("--format", choices=sorted(FORMATS), default="md")
    parser.add_argument("--paper", metavar="|".join(papers.names()),
                        help="write this paper's scorecard instead of the report")
    args = parser.parse_args(argv)
    if args.paper is not None and args.paper not in papers.names():
        print(f"error: unknown paper {args.paper!r}; papers: {', '.join(papers.names())}",
              file=sys.stderr)
        return 2
    if args.diff != (args.other is not None):
        print("error: --diff compares two sides: python -m raylf.report A B --diff",
              file=sys.stderr)
        return 2
    try:
        if args.diff:
            print(render_diff(args.sweep_dir, args.other))
            return 0
        if args.paper:
            written = write_scorecard(args.sweep_dir, args.paper, args.out, (args.format,))
        else:
            written = write_report(args.sweep_dir, args.out, (args.format,))
    except (ValueError, FileNotFoundError) as err:  # no sweep there, or none of the paper
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # storage that did not answer: run it again once it does
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.format == "md":
        fs, path = results.filesystem(written["md"])
        with fs.open_input_stream(path) as stream:
            print(stream.read().decode())
    print(f"{'scorecard' if args.paper else 'report'}: {written[args.format]}")
    if not args.paper:
        print(f"figures: {written['figures']}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
