"""Method registry: one module per method family, each holding both halves; a module's
classes register themselves with ``@register``, so importing it is all a new method needs."""

from __future__ import annotations

from raylf.methods import (  # noqa: F401  (they register)
    apfl,
    clustered_oracle,
    ditto,
    fc,
    fedala,
    fedamp,
    fedavg,
    fedavg_se,
    fedbabu,
    fedce,
    feddisco,
    fedfomo,
    fedproto,
    fedrep,
    fedrod,
    fedsoft,
    fmtsvm,
    hdcfl,
    ifca,
    lgfedavg,
    local,
    moon,
    pacfl,
    perfedavg,
    pfedme,
    scaffold,
    spcacw,
)
from raylf.methods.base import METHODS, Method, MethodContext, MethodParams, register

__all__ = ["METHODS", "Method", "MethodContext", "MethodParams", "register"]
