"""The benchmarks' local Ray runs without token authentication, and each script says so.

Ray turns token authentication on for a local ``ray.init``; the benchmarks, like the test suite,
turn it off (``RAY_AUTH_MODE=disabled``) for the throwaway single-machine Ray they start (the
Ray that a peer framework's venv pins may not support it). While a benchmark runs, any process
on the machine that reaches that Ray's ports can then run code in it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

WARNING = ("warning: this benchmark's local Ray runs with token authentication off "
           "(RAY_AUTH_MODE=disabled): any process on this machine that reaches its ports can run "
           "code in it while it runs; run benchmarks only on a machine you do not share with "
           "users you do not trust")


def warn_token_auth_off(env: Mapping[str, str] = os.environ) -> None:
    """Print :data:`WARNING` when ``env`` (what the benchmark's Ray starts with) turns token
    authentication off."""
    if env.get("RAY_AUTH_MODE") == "disabled":
        print(WARNING, file=sys.stderr, flush=True)
