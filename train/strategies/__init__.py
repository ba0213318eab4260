"""Training strategies, one module each, behind one protocol (train/strategies/base.py).

`STRATEGIES` is the registry. Its order is the order in which the recipe calls the hooks:
- `--freeze` before `--l2sp` before drift: the drift groups are cut at the layers of the first
  strategy that names layers, and drift reuses the L2-SP reference instead of copying BASE;
- freezing before LoRA's adapters, which go only where layers train;
- the EMA callback before the others', so that what runs after a step sees averaged weights.
Each strategy's options (its `Options`) are one field of `TrainConfig` (train/config.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from train.limits import require_narrowed_layers
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

__all__ = ["STRATEGIES", "Strategies", "Strategy", "check", "choose"]


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
    """Every strategy's `plan`, in registry order, against BASE's layout (each checks the layers
    it names against BASE's tensors).

    Returns:
        The strategies the options ask for.

    Raises:
        TrainConfigError: `--modules` and no strategy names layers for it to narrow.
    """
    names = frozenset(s.name for s in STRATEGIES)
    chosen = Strategies((), names, modules, attention_only)
    for strategy in STRATEGIES:
        planned = strategy.plan(config, layout, chosen)
        if planned is not None:
            chosen = chosen.adding(planned)
    require_narrowed_layers(modules, chosen.named_layers)
    return chosen
