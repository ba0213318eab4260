"""The recipe's fourth step: the strategies' hooks and the evaluation callbacks, on the Trainer.

Strategies that hold copies of the weights as they sit on their devices (L2-SP, drift, EMA)
create them when they are bound to the model (`trainer.when_bound`): at once, or under FSDP
once FSDP has sharded the model (then each holds this rank's shards).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from train.errors import TrainConfigError
from train.periodic_eval import PeriodicEval, Scorer
from train.strategies import STRATEGIES
from train.trainer import SkipFinalCheckpoint

if TYPE_CHECKING:
    from transformers import TrainerCallback

    from train.config import TrainPlan
    from train.layer_map import LayerMap
    from train.strategies import Strategies
    from train.trainer import SurgeryTrainer

logger = logging.getLogger(__name__)


def attach(
    trainer: SurgeryTrainer, layers: LayerMap, plan: TrainPlan, score: Scorer | None
) -> list[TrainerCallback]:
    """Prepare the strategies on the trainer (bound now unless FSDP binds them later).

    Args:
        trainer: the run's trainer.
        layers: the model's parameters' layers (before LoRA's wrapping).
        plan: the run's plan.
        score: the held-out scorer of `--eval-every`.

    Returns:
        The wrapper's callbacks, in the order they must run: the strategies' (registry order),
        then the periodic scores, which must see the weights the step ends with.

    Raises:
        TrainConfigError: strategies under DeepSpeed or FSDP1, which hide their parameters.
    """
    strategies = plan.strategies
    _check_distributed(trainer, strategies)
    own: list[TrainerCallback] = []
    for strategy in strategies:  # each bound now, or under FSDP after sharding
        own += strategy.attach(trainer, layers, strategies, plan.resume_from)
    if not plan.config.keep_checkpoints and not trainer.args.load_best_model_at_end:
        # (When the best step is reloaded at the end, the last one may be it: keep its save.)
        own.append(SkipFinalCheckpoint())
    if score is not None and plan.config.eval_every is not None:
        own.append(PeriodicEval(trainer, score, plan.config.eval_every))
    return own


def _check_distributed(trainer: SurgeryTrainer, strategies: Strategies) -> None:
    """Refuse the combinations whose strategies cannot see their parameters' shards."""
    if not any(s.needs_parameters for s in strategies):
        return
    flags = [s.flag() for s in STRATEGIES if s.needs_parameters]
    named = f"{', '.join(flags[:-1])} and {flags[-1]}" if len(flags) > 1 else flags[0]
    if trainer.is_deepspeed_enabled:
        raise TrainConfigError(f"{named} run under DDP or FSDP2 (--fsdp), not DeepSpeed")
    plugin = trainer.accelerator.state.fsdp_plugin if trainer.is_fsdp_enabled else None
    if plugin is not None and getattr(plugin, "fsdp_version", 1) != 2:
        raise TrainConfigError(
            f"{named} under FSDP need FSDP2 (per-parameter shards): drop "
            "'version: 1' from the FSDP config"
        )
