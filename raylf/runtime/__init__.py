"""Backends that run an experiment's rounds: in-process (``local``) and on Ray (``ray``); a Ray
trial of one worker trains in its own process (``inline``, chosen by the sweep, not a user)."""

from __future__ import annotations

from raylf.runtime.blueprint import Blueprint

BACKENDS = ("ray", "local")


def open_runtime(backend: str, blueprint: Blueprint, placement=None, label: str = "raylf"):
    if backend == "local":
        from raylf.runtime.local import LocalRuntime

        return LocalRuntime(blueprint)
    if backend == "inline":
        from raylf.runtime.inline import InlineRuntime

        return InlineRuntime(blueprint)
    if backend == "ray":
        from raylf.runtime.ray_backend import RayRuntime

        return RayRuntime(blueprint, placement, label)
    raise ValueError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Blueprint", "open_runtime"]
