"""Weight averaging (`--ema ALPHA`, `--ema-every ETA`): every eta steps,
theta = alpha * theta_prev + (1 - alpha) * theta'.

The average and its callback are in train/strategies/averaging.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from train.errors import TrainConfigError
from train.fields import cli
from train.strategies.base import Config, Strategies, Strategy

if TYPE_CHECKING:
    from torch import nn
    from transformers import TrainerCallback

    from train.checkpoint_io import CheckpointLayout
    from train.layer_map import LayerMap
    from train.sources import DataSource
    from train.trainer import SurgeryTrainer


@dataclass
class EMAOptions:
    """`TrainConfig.ema`: `alpha` and `every`, alpha and eta of the weight average."""

    alpha: float | None = field(
        default=None,
        metadata=cli(
            "Average weights: theta = ALPHA * theta_prev + (1 - ALPHA) * theta'.",
            flag="--ema",
            metavar="ALPHA",
        ),
    )
    every: int = field(
        default=1, metadata=cli("Steps between EMA averages.", flag="--ema-every", metavar="ETA")
    )


@dataclass(frozen=True)
class WeightAverage(Strategy):
    """The weight average of the trainable parameters, taken every `every` optimizer steps.

    Attributes:
        alpha: the weight of the previous average, in (0, 1).
        every: eta, optimizer steps between averages.
    """

    name = "ema"
    Options = EMAOptions
    needs_parameters = True

    alpha: float
    every: int

    @classmethod
    def check(cls, config: Config, sources: tuple[DataSource, ...]) -> tuple[DataSource, ...]:
        """alpha in (0, 1), eta positive."""
        options = config.ema
        if options.every <= 0:
            raise TrainConfigError(f"--ema-every must be positive, got {options.every}")
        if options.alpha is not None and not 0 < options.alpha < 1:
            raise TrainConfigError(
                f"--ema is the weight of the previous average, in (0, 1); got {options.alpha}"
            )
        return sources

    @classmethod
    def plan(
        cls, config: Config, layout: CheckpointLayout, chosen: Strategies
    ) -> WeightAverage | None:
        """The average, when `--ema` is given."""
        options = config.ema
        return None if options.alpha is None else cls(alpha=options.alpha, every=options.every)

    def attach(
        self,
        trainer: SurgeryTrainer,
        layers: LayerMap,
        strategies: Strategies,
        resume_from: Path | None,
    ) -> list[TrainerCallback]:
        """Copy the trainable parameters (the anchor) when they are bound, reloading a resumed
        run's anchor; the callback averages after every eta-th step.

        Returns:
            The averaging callback: before the periodic scores and the caller's callbacks, so
            they see the averaged weights.
        """
        from train.strategies.averaging import EMA, EMACallback

        callback = EMACallback()

        def bind(model: nn.Module) -> None:
            ema = EMA(model, self.alpha, self.every)
            if resume_from is not None and (resume_from / ema.file_name).is_file():
                ema.load(resume_from / ema.file_name)
            callback.ema = ema
            trainer.held_bytes["ema_anchor"] = sum(t.nbytes for t in ema.anchor.values())

        trainer.when_bound(bind)
        return [callback]

    @classmethod
    def summary(cls, config: Config) -> list[str]:
        """`--ema ALPHA`."""
        return [f"--ema {config.ema.alpha}"] if config.ema.alpha is not None else []
