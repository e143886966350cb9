"""User plugins: modules named in ``RAYLF_PLUGINS`` are imported before any spec is validated.

A plugin registers its own methods, datasets, scenarios or models in the registries, so a team
can add a method without forking raylf. Every process that validates a spec (the driver, a Tune
trial, each actor) imports them, so they work on every backend; the module must be importable
there (installed, or on ``PYTHONPATH`` / in the job's working directory).
"""

from __future__ import annotations

import importlib
import os

_loaded: set[str] = set()


def load_plugins() -> None:
    for name in filter(None, (n.strip() for n in os.environ.get("RAYLF_PLUGINS", "").split(","))):
        if name not in _loaded:
            importlib.import_module(name)
            _loaded.add(name)
