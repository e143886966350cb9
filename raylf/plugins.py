"""User plugins: modules named in ``RAYLF_PLUGINS`` are imported before any spec is validated.

A plugin registers its own methods, datasets, scenarios or models in the registries, so a team
can add a method without forking raylf. Every process that validates a spec (the driver, a Tune
trial, each actor) imports them, so they work on every backend. :func:`runtime_env` is what a
driver passes to ``ray.init`` so that the processes of a joined cluster see them too: the
variable itself, and the plugin's own files when it is not an installed package.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sysconfig
from pathlib import Path

ENV_VAR = "RAYLF_PLUGINS"
_loaded: set[str] = set()


def plugin_names() -> list[str]:
    return [n for n in (n.strip() for n in os.environ.get(ENV_VAR, "").split(",")) if n]


def load_plugins() -> None:
    for name in plugin_names():
        if name not in _loaded:
            importlib.import_module(name)
            _loaded.add(name)


def _local_source(module: str) -> str | None:
    """The top-level package folder (or single file) of ``module`` unless it is installed."""
    spec = importlib.util.find_spec(module.split(".", 1)[0])
    if spec is None or spec.origin in (None, "built-in", "frozen"):
        return None
    installed = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    if spec.submodule_search_locations:
        source = Path(next(iter(spec.submodule_search_locations))).resolve()
    else:
        source = Path(spec.origin).resolve()
    if any(source.is_relative_to(folder) for folder in installed):
        return None
    return str(source)


def runtime_env(job_env: dict | None = None) -> dict | None:
    """``ray.init(runtime_env=…)`` carrying the plugins to every worker of the cluster.

    ``job_env`` is the runtime environment a Ray Job was submitted with: its working directory
    already holds local plugin files and the job's own variables win, so only what it lacks is
    added (Ray refuses to merge a variable set twice).
    """
    names = plugin_names()
    if not names:
        return None
    job_env = job_env or {}
    env: dict = {}
    if ENV_VAR not in job_env.get("env_vars", {}):
        env["env_vars"] = {ENV_VAR: ",".join(names)}
    if "working_dir" not in job_env and "py_modules" not in job_env:
        modules = sorted({s for s in map(_local_source, names) if s is not None})
        if modules:
            env["py_modules"] = modules
    return env or None
