"""``python -m raylf.report SWEEP_DIR [--out DIR] [--format md|html|latex]``.

Exit codes: 0 written, 2 no sweep at SWEEP_DIR (nothing written), 1 the storage failed."""

from __future__ import annotations

import argparse
import sys

from raylf import results
from raylf.report import FORMATS, write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raylf.report", description=__doc__)
    parser.add_argument("sweep_dir", help="a sweep or experiment directory (path or s3://, gs://)")
    parser.add_argument("--out", help="where to write the report (default SWEEP_DIR/report)")
    parser.add_argument("--format", choices=sorted(FORMATS), default="md")
    args = parser.parse_args(argv)
    try:
        written = write_report(args.sweep_dir, args.out, (args.format,))
    except (ValueError, FileNotFoundError) as err:  # no sweep there: the user's mistake
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # storage that did not answer: run it again once it does
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.format == "md":
        fs, path = results.filesystem(written["md"])
        with fs.open_input_stream(path) as stream:
            print(stream.read().decode())
    print(f"report: {written[args.format]}")
    print(f"figures: {written['figures']}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
