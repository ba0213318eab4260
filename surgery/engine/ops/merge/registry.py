"""Merge methods by name (mergekit's names)."""

from __future__ import annotations

from surgery.engine.ops.merge import (
    arcee_fusion,
    karcher,
    linear,
    model_stock,
    multislerp,
    nearswap,
    nuslerp,
    passthrough,
    sce,
    slerp,
)
from surgery.engine.ops.merge.method import Method
from surgery.engine.ops.merge.ram import METHODS as RAM
from surgery.engine.ops.merge.spec import MergeConfigError
from surgery.engine.ops.merge.task_arithmetic import METHODS as TASK_ARITHMETIC

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        linear.METHOD,
        *TASK_ARITHMETIC,
        slerp.METHOD,
        nuslerp.METHOD,
        model_stock.METHOD,
        passthrough.METHOD,
        multislerp.METHOD,
        karcher.METHOD,
        nearswap.METHOD,
        *RAM,
        sce.METHOD,
        arcee_fusion.METHOD,
    )
}


def get(name: str) -> Method:
    """The method called `name`.

    Raises:
        MergeConfigError: no such method here (naming the ones there are).
    """
    if name not in METHODS:
        raise MergeConfigError(
            f"merge_method {name!r} is not supported; choose one of {', '.join(METHODS)}"
        )
    return METHODS[name]
