"""Datasets, scenarios and the per-experiment federation built from them."""

from raylf.data.federation import ClientData, Federation, ShardData, build_federation

__all__ = ["ClientData", "Federation", "ShardData", "build_federation"]
