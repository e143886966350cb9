"""Datasets, scenarios and the per-experiment federation built from them.

The federation (and with it torch) is imported on first use, not with the package: the report
reads the papers' settings from :mod:`raylf.data.presets` and must stand on results alone.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ClientData", "Federation", "ShardData", "build_federation"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from raylf.data import federation

        return getattr(federation, name)
    raise AttributeError(f"module 'raylf.data' has no attribute {name!r}")
