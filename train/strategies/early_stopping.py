"""Early stopping (`--early-stopping METRIC[:min|max]`, `--patience`,
`--early-stopping-threshold`): stop when a periodic held-out score (`--eval-every`) has not
improved for `patience` scores, and save the best scored step's weights.

transformers' own machinery does the work: EarlyStoppingCallback, and the Trainer's best-model
tracking and reload (`load_best_model_at_end`) on the periodic scores, which
`SurgeryTrainer.evaluate` hands it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from train.errors import TrainConfigError
from train.fields import cli
from train.strategies.base import Config, Strategies, Strategy

if TYPE_CHECKING:
    from transformers import TrainerCallback

    from train.checkpoint_io import CheckpointLayout
    from train.layer_map import LayerMap
    from train.sources import DataSource
    from train.trainer import SurgeryTrainer

# Metric names (their last part) whose direction needs no `:min` or `:max`.
_HIGHER = ("acc", "acc_norm", "acc_bytes", "chrf", "chrf++", "exact_match")
_LOWER = ("ppl", "word_perplexity", "byte_perplexity", "bits_per_byte", "loss")


@dataclass
class EarlyStoppingOptions:
    """`TrainConfig.early_stopping`: `metric` ("ppl/sk/ppl", "belebele/acc:max"), `patience`
    and `threshold`, as transformers' EarlyStoppingCallback takes them."""

    metric: str | None = field(
        default=None,
        metadata=cli(
            "Stop when this --eval-every metric has not improved for --patience scores, and "
            "save the best step's weights, e.g. ppl/sk/ppl or belebele/acc:max.",
            flag="--early-stopping",
            metavar="METRIC[:min|max]",
        ),
    )
    patience: int = field(
        default=6,
        metadata=cli(
            "Scores without improvement before --early-stopping stops.", flag="--patience"
        ),
    )
    threshold: float = field(
        default=0.005,
        metadata=cli(
            "Least change that counts as an improvement for --early-stopping.",
            flag="--early-stopping-threshold",
        ),
    )


@dataclass(frozen=True)
class EarlyStopping(Strategy):
    """Early stopping on one logged eval metric (names as logged, without `eval/`).

    Attributes:
        metric, greater_is_better: the metric and its direction.
        patience, threshold: as transformers' EarlyStoppingCallback takes them.
        every: the scoring interval (`--eval-every`), at whose steps checkpoints are kept.
    """

    name = "early_stopping"
    Options = EarlyStoppingOptions

    metric: str
    greater_is_better: bool
    patience: int
    threshold: float
    every: int | None = None

    @classmethod
    def check(cls, config: Config, sources: tuple[DataSource, ...]) -> tuple[DataSource, ...]:
        """The metric parses; `--eval-every` is given and, with `--ema`, a multiple of
        `--ema-every`."""
        options = config.early_stopping
        if options.metric is None:
            return sources
        if config.eval_every is None:
            raise TrainConfigError("--early-stopping needs --eval-every N with -t TASK")
        if config.ema.alpha is not None and config.eval_every % config.ema.every:
            # Scored (and saved) steps must be averaged ones, or the best would be raw weights.
            raise TrainConfigError(
                "--early-stopping with --ema: --eval-every must be a multiple of --ema-every"
            )
        parse_early_stopping(options.metric, options.patience, options.threshold)
        return sources

    @classmethod
    def plan(
        cls, config: Config, layout: CheckpointLayout, chosen: Strategies
    ) -> EarlyStopping | None:
        """The parsed metric, when `--early-stopping` is given."""
        options = config.early_stopping
        if options.metric is None:
            return None
        return parse_early_stopping(
            options.metric, options.patience, options.threshold, every=config.eval_every
        )

    def arguments(self) -> dict:
        """The Trainer's own best-model machinery: an evaluation at every scored step (the
        periodic scores, see `SurgeryTrainer.evaluate`), a checkpoint at each of them (so the
        best step always has one to reload), and the best reloaded at the end."""
        return {
            "eval_strategy": "steps",
            "eval_steps": self.every,
            "save_steps": self.every,
            "load_best_model_at_end": True,
            "metric_for_best_model": self.metric,
            "greater_is_better": self.greater_is_better,
        }

    def attach(
        self,
        trainer: SurgeryTrainer,
        layers: LayerMap,
        strategies: Strategies,
        resume_from: Path | None,
    ) -> list[TrainerCallback]:
        """transformers' EarlyStoppingCallback."""
        from transformers import EarlyStoppingCallback

        return [EarlyStoppingCallback(self.patience, self.threshold)]

    def record(self, trainer: SurgeryTrainer) -> dict:
        """What early stopping chose: the saved weights are those of `best_step`."""
        state = trainer.state
        return {
            "early_stopping": {
                "metric": self.metric,
                "best_step": state.best_global_step,
                "best_value": state.best_metric,
                "stopped_at": state.global_step,
                "stopped_early": state.global_step < state.max_steps,
            }
        }


def parse_early_stopping(
    spec: str, patience: int, threshold: float, every: int | None = None
) -> EarlyStopping:
    """Parse `METRIC[:min|max]` (e.g. `ppl/sk/ppl`, `belebele/acc:max`).

    Args:
        spec: the metric, as `--early-stopping` takes it.
        patience, threshold: `--patience` and `--early-stopping-threshold`.
        every: `--eval-every`.

    Raises:
        TrainConfigError: an empty metric, or no direction for a metric of unknown kind.
    """
    metric, _, mode = spec.removeprefix("eval/").partition(":")
    leaf = metric.rsplit("/", 1)[-1]
    if not metric or mode not in ("", "min", "max"):
        raise TrainConfigError(f"--early-stopping {spec!r}: give METRIC[:min|max], e.g. ppl/ppl")
    if not mode and leaf not in _HIGHER + _LOWER:
        raise TrainConfigError(
            f"--early-stopping {spec!r}: is higher or lower better? add :max or :min"
        )
    greater = mode == "max" or (not mode and leaf in _HIGHER)
    if patience < 1 or threshold < 0:
        raise TrainConfigError("--patience must be >= 1 and --early-stopping-threshold >= 0")
    return EarlyStopping(metric, greater, patience, threshold, every)
