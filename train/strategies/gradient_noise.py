"""Gradient noise (`--grad-noise SIGMA`): N(0, SIGMA^2) added to every trained parameter's
gradient once per optimizer step, before clipping."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from train.errors import TrainConfigError
from train.fields import cli
from train.sharding import local
from train.strategies.base import Config, Strategies, Strategy

if TYPE_CHECKING:
    from torch import nn
    from transformers import TrainerCallback

    from train.checkpoint_io import CheckpointLayout
    from train.layer_map import LayerMap
    from train.sources import DataSource
    from train.trainer import SurgeryTrainer


@dataclass
class GradientNoiseOptions:
    """`TrainConfig` field `grad_noise`: the noise's standard deviation."""

    grad_noise: float | None = field(
        default=None,
        metadata=cli("Add N(0, SIGMA^2) to each gradient per optimizer step.", metavar="SIGMA"),
    )


@dataclass(frozen=True)
class GradientNoise(Strategy):
    """Gaussian noise on the gradients, seeded by `--seed`.

    Attributes:
        sigma: the noise's standard deviation.
        seed: the noise generator's seed.
    """

    name = "gradient_noise"
    Options = GradientNoiseOptions

    sigma: float
    seed: int

    @classmethod
    def check(cls, config: Config, sources: tuple[DataSource, ...]) -> tuple[DataSource, ...]:
        """SIGMA is positive and finite."""
        sigma = config.grad_noise
        if sigma is not None and not (sigma > 0 and math.isfinite(sigma)):
            raise TrainConfigError(f"--grad-noise must be positive, got {sigma}")
        return sources

    @classmethod
    def plan(
        cls, config: Config, layout: CheckpointLayout, chosen: Strategies
    ) -> GradientNoise | None:
        """The noise, when `--grad-noise` is given."""
        if config.grad_noise is None:
            return None
        return cls(sigma=config.grad_noise, seed=config.seed)

    def attach(
        self,
        trainer: SurgeryTrainer,
        layers: LayerMap,
        strategies: Strategies,
        resume_from: Path | None,
    ) -> list[TrainerCallback]:
        """Add the noise at every optimizer step, to the parameters as they are bound."""

        def bind(model: nn.Module) -> None:
            import torch

            params = [p for p in model.parameters() if p.requires_grad]
            generator = torch.Generator().manual_seed(self.seed)

            def add_noise(scale: float) -> None:
                with torch.no_grad():
                    for param in params:
                        if param.grad is None:
                            continue
                        grad = local(param.grad)
                        noise = torch.randn(grad.shape, generator=generator)
                        grad.add_(noise.to(grad), alpha=self.sigma * scale)

            trainer.gradient_hooks.append(add_noise)

        trainer.when_bound(bind)
        return []

    @classmethod
    def summary(cls, config: Config) -> list[str]:
        """`--grad-noise SIGMA`."""
        return [f"--grad-noise {config.grad_noise}"] if config.grad_noise is not None else []
