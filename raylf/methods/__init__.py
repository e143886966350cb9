"""Method registry: one module per method family, each holding both halves."""

from __future__ import annotations

from raylf.methods.base import Method, MethodContext, MethodParams
from raylf.methods.fedavg import FedAvg, FedProx
from raylf.methods.fedavg_se import FedAvgSE
from raylf.methods.fmtsvm import FMTSVM, FedPureCNN, FedPureSVM
from raylf.methods.local import Local
from raylf.registry import Registry

METHODS: Registry[type[Method]] = Registry("method")
for _cls in (FedAvg, FedProx, FedAvgSE, Local, FMTSVM, FedPureCNN, FedPureSVM):
    METHODS.register(_cls.name)(_cls)


def build_method(name: str, params: MethodParams, ctx: MethodContext) -> Method:
    return METHODS.get(name)(params, ctx)


__all__ = ["METHODS", "Method", "MethodContext", "MethodParams", "build_method"]
