"""Training strategies, one module each, behind one protocol (train/strategies/base.py).

`STRATEGIES` is the registry. Its order is the order in which the recipe calls the hooks:
- `--freeze` before `--l2sp` before drift: the drift groups are cut at the layers of the first
  strategy that names layers, and drift reuses the L2-SP reference instead of copying BASE;
- freezing before LoRA's adapters, which go only where layers train;
- the EMA callback before the others', so that what runs after a step sees averaged weights.
`with_options` makes each strategy's options fields of `TrainConfig`.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from typing import TYPE_CHECKING

from train.strategies.base import Config, Strategies, Strategy
from train.strategies.curriculum import Curriculum
from train.strategies.drift import Drift
from train.strategies.early_stopping import EarlyStopping
from train.strategies.ema import WeightAverage
from train.strategies.freeze import Freeze
from train.strategies.l2sp import L2SPToBase
from train.strategies.lora import LoRA

if TYPE_CHECKING:
    from surgery.core.modules import ModuleFilter
    from train.checkpoint_io import CheckpointLayout
    from train.sources import DataSource

STRATEGIES: tuple[type[Strategy], ...] = (
    Freeze,
    L2SPToBase,
    Drift,
    WeightAverage,
    LoRA,
    Curriculum,
    EarlyStopping,
)

__all__ = ["STRATEGIES", "Strategies", "Strategy", "check", "choose", "with_options"]


def with_options(cls: type) -> type:
    """Add every strategy's options (the fields of its `Options`) to a class body about to
    become a dataclass: after the field the strategy's `after` names, behind the options of
    strategies earlier in the registry placed there, or (`after` None) at the end of the
    command-line options, before the hidden ones.

    Raises:
        TypeError: an option that repeats a field's name, or an `after` naming no field.
    """
    order = list(cls.__annotations__)
    annotations = dict(cls.__annotations__)
    last_at: dict[str | None, str] = {}  # the last option placed after each field
    for strategy in STRATEGIES:
        hints = typing.get_type_hints(strategy.Options)
        options = dataclasses.fields(strategy.Options)
        anchor = last_at.get(strategy.after, strategy.after)
        if anchor is not None and anchor not in order:
            raise TypeError(f"{strategy.__name__}.after: no field {anchor!r}")
        index = order.index(anchor) + 1 if anchor is not None else _end_of_options(cls, order)
        for offset, option in enumerate(options):
            if option.name in annotations:
                raise TypeError(f"{strategy.__name__}: option {option.name!r} exists already")
            order.insert(index + offset, option.name)
            annotations[option.name] = hints[option.name]
            setattr(cls, option.name, copy.copy(option))
        last_at[strategy.after] = options[-1].name
    cls.__annotations__ = {name: annotations[name] for name in order}
    return cls


def _end_of_options(cls: type, order: list[str]) -> int:
    """The position of the first hidden field (Python API only), else the end."""
    hidden = [
        i
        for i, name in enumerate(order)
        if isinstance(getattr(cls, name, None), dataclasses.Field)
        and getattr(cls, name).metadata.get("cli", {}).get("hidden")
    ]
    return hidden[0] if hidden else len(order)


def check(config: Config, sources: tuple[DataSource, ...]) -> tuple[DataSource, ...]:
    """Every strategy's `check`, in registry order: the options that need no layers.

    Returns:
        The data sources as the strategies refine them (the curriculum's limits).
    """
    for strategy in STRATEGIES:
        sources = strategy.check(config, sources)
    return sources


def choose(
    config: Config, layout: CheckpointLayout, modules: ModuleFilter | None, attention_only: bool
) -> Strategies:
    """Every strategy's `plan`, in registry order, against BASE's layout.

    Returns:
        The strategies the options ask for.
    """
    names = frozenset(s.name for s in STRATEGIES)
    chosen = Strategies((), names, modules, attention_only)
    for strategy in STRATEGIES:
        planned = strategy.plan(config, layout, chosen)
        if planned is not None:
            chosen = chosen.adding(planned)
    return chosen
