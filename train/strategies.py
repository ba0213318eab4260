"""The recipe's fourth step: L2-SP, drift, EMA and the evaluation callbacks, on the Trainer.

L2-SP, drift and EMA hold copies of the weights as they sit on their devices, so they are
created when they are bound to the model: now, or under FSDP by `trainer.bind_strategies` once
FSDP has sharded the model (then each holds this rank's shards).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from train.drift import DriftMonitor
from train.ema import EMA, EMACallback
from train.errors import TrainConfigError
from train.periodic_eval import PeriodicEval, Scorer
from train.regularizers import L2SP
from train.sharding import any_sharded
from train.trainer import SkipFinalCheckpoint

if TYPE_CHECKING:
    from transformers import PreTrainedModel, TrainerCallback

    from train.config import Strategies
    from train.layer_map import LayerMap
    from train.trainer import SurgeryTrainer

logger = logging.getLogger(__name__)


def attach(
    trainer: SurgeryTrainer,
    layers: LayerMap,
    strategies: Strategies,
    resume_from: Path | None,
    score: Scorer | None,
    keep_checkpoints: bool,
) -> list[TrainerCallback]:
    """Prepare the strategies on the trainer (bound now unless FSDP binds them later).

    Args:
        trainer: the run's trainer.
        layers: the model's parameters' layers (before LoRA's wrapping).
        strategies: the run's strategies.
        resume_from: the checkpoint a resumed run continues from (its EMA anchor is reloaded).
        score: the held-out scorer of `--eval-every`.
        keep_checkpoints: keep the final resumable checkpoint (`--keep-checkpoints`).

    Returns:
        The wrapper's callbacks, in the order they must run.

    Raises:
        TrainConfigError: strategies under DeepSpeed or FSDP1, which hide their parameters.
    """
    _check_distributed(trainer, strategies)
    callback = EMACallback() if strategies.ema is not None else None

    def bind(model: PreTrainedModel) -> None:
        _attach_to(trainer, model, layers, strategies, resume_from, callback)

    if trainer.is_fsdp_enabled:
        trainer.bind = bind  # after sharding, in create_scheduler
    else:
        bind(trainer.model)
    own: list[TrainerCallback] = [callback] if callback is not None else []
    early = strategies.early_stopping
    if not keep_checkpoints and early is None:
        # (With early stopping the last step may be the best one: its checkpoint is reloaded.)
        own.append(SkipFinalCheckpoint())
    if score is not None and strategies.eval_every is not None:
        own.append(PeriodicEval(trainer, score, strategies.eval_every))
    if early is not None:
        from transformers import EarlyStoppingCallback

        own.append(EarlyStoppingCallback(early.patience, early.threshold))
    return own


def _check_distributed(trainer: SurgeryTrainer, strategies: Strategies) -> None:
    """Refuse the combinations whose strategies cannot see their parameters' shards."""
    if strategies.l2sp is None and strategies.ema is None and strategies.lora is None:
        return
    if trainer.is_deepspeed_enabled:
        raise TrainConfigError(
            "--l2sp, --ema and --lora run under DDP or FSDP2 (--fsdp), not DeepSpeed"
        )
    plugin = trainer.accelerator.state.fsdp_plugin if trainer.is_fsdp_enabled else None
    if plugin is not None and getattr(plugin, "fsdp_version", 1) != 2:
        raise TrainConfigError(
            "--l2sp, --ema and --lora under FSDP need FSDP2 (per-parameter shards): drop "
            "'version: 1' from the FSDP config"
        )


def _attach_to(
    trainer: SurgeryTrainer,
    model: PreTrainedModel,
    layers: LayerMap,
    strategies: Strategies,
    resume_from: Path | None,
    ema_callback: EMACallback | None,
) -> None:
    """Create L2-SP, drift and EMA on the model's parameters as they sit on their devices
    (this rank's shards under FSDP)."""
    if strategies.l2sp is not None:
        # --modules narrows the ranges: a tensor it leaves out gets the `*` lambda;
        # --attention-only leaves the MLPs out altogether (lambda 0), as the paper's code.
        trainer.l2sp = L2SP.from_model(
            model, strategies.l2sp, layers.narrowed, strategies.l2sp_form, layers.unregularized
        )
        held = sum(t.reference.nbytes for t in trainer.l2sp.terms)
        trainer.held_bytes["l2sp_reference"] = held
        logger.info("L2-SP: %d regularized tensors, reference %d bytes", len(trainer.l2sp), held)
    sharded = any_sharded(model)
    # Drift is a collective under FSDP (every rank measures its shards); else rank 0 alone.
    if strategies.drift and not strategies.lora and (sharded or trainer.is_world_process_zero()):
        shared = {t.name: t.reference for t in trainer.l2sp.terms} if trainer.l2sp else {}
        trainer.drift = DriftMonitor(model, strategies.drift_groups, layers.layers, shared)
        own = [r for name, (_, _, r) in trainer.drift.params.items() if name not in shared]
        trainer.held_bytes["drift_reference"] = sum(r.nbytes for r in own)
    if ema_callback is None:
        return
    ema = EMA(model, strategies.ema, strategies.ema_every)
    if resume_from is not None and (resume_from / ema.file_name).is_file():
        ema.load(resume_from / ema.file_name)
    ema_callback.ema = ema
    trainer.held_bytes["ema_anchor"] = sum(t.nbytes for t in ema.anchor.values())
