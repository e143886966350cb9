"""``python -m raylf.sweep SPEC.yaml``: the sweep's command line (``raylf.sweep.cli``)."""

import sys

from raylf.sweep.cli import main

if __name__ == "__main__":
    sys.exit(main())
