"""The recipe's last step: full weights written in BASE's layout, with the run's record."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from train.checkpoint_io import CheckpointLayout, to_base_layout, write_checkpoint
from train.lora import merge_lora, merge_lora_state_dict
from train.outputs import carried_entries
from train.sharding import full_state_dict

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from train.config import EarlyStop, LoraSpec, TrainConfig
    from train.trainer import SurgeryTrainer

logger = logging.getLogger(__name__)


def save(
    trainer: SurgeryTrainer,
    cfg: TrainConfig,
    layout: CheckpointLayout,
    output: Path,
    lora: LoraSpec | None,
    early: EarlyStop | None,
) -> None:
    """Gather full weights, write them in BASE's layout on the main process.

    The engine writes the checkpoint beside OUT and then replaces OUT (and with it the
    resumable checkpoints, unless kept) in one rename; with --force, also an OUT that another
    run left or created meanwhile.

    Args:
        trainer: the trainer after training.
        cfg: the run's configuration (recorded in `surgery_train.json`).
        layout: BASE's layout.
        output: OUT.
        lora: the LoRA adapters to merge into the weights.
        early: `--early-stopping`, whose chosen step is recorded.
    """
    main = trainer.is_world_process_zero()
    record = _record(trainer, cfg, early) if main else {}
    model, state_dict = _full_weights(trainer, lora, main)
    if main:
        checkpoints = Path(trainer.args.output_dir)  # the resumable checkpoints
        carry = carried_entries(checkpoints, output, cfg.keep_checkpoints, cfg.force)
        tensors = to_base_layout(model, state_dict, layout)
        replace = cfg.force or None
        write_checkpoint(
            output, layout, tensors, record, carry=carry, replace=replace, quiet=not cfg.progress
        )
        logger.debug("saved %s", output)  # the command says it, once
    trainer.accelerator.wait_for_everyone()
    # Let the next run in this process (tests, pipelines) start without a stale process group.
    if os.environ.get("WORLD_SIZE", "1") == "1":
        trainer.accelerator.free_memory()


def _record(trainer: SurgeryTrainer, cfg: TrainConfig, early: EarlyStop | None) -> dict:
    """The run's record, written as `surgery_train.json` (all of it but the log history is also
    the recipe's)."""
    return {
        "config": dataclasses.asdict(cfg),
        "steps": trainer.state.global_step,
        "tokens": trainer.args.max_steps * trainer.tokens_per_step,
        "world_size": trainer.args.world_size,
        "global_batch_blocks": trainer.global_batch_blocks,
        "sharded": trainer.is_fsdp_enabled,
        # What the strategies hold on the main process (one shard of each under FSDP).
        "held_bytes_rank0": trainer.held_bytes,
        **_best_step(trainer, early),
        "log_history": trainer.state.log_history,
    }


def _full_weights(
    trainer: SurgeryTrainer, lora: LoraSpec | None, main: bool
) -> tuple[PreTrainedModel, dict[str, torch.Tensor]]:
    """The trained model (unwrapped, LoRA merged) and its full state dict (empty on the other
    ranks under FSDP)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if trainer.is_fsdp_enabled:
        # A collective: every rank gathers tensor by tensor, only the main process keeps them.
        state_dict = full_state_dict(model, keep=main)
        if lora is None:
            return model, state_dict
        return model.get_base_model(), merge_lora_state_dict(state_dict, lora) if main else {}
    if lora is not None:
        model = merge_lora(model)
    return model, model.state_dict()


def _best_step(trainer: SurgeryTrainer, early: EarlyStop | None) -> dict:
    """What `--early-stopping` chose: the saved weights are those of `best_step`."""
    if early is None:
        return {}
    state = trainer.state
    return {
        "early_stopping": {
            "metric": early.metric,
            "best_step": state.best_global_step,
            "best_value": state.best_metric,
            "stopped_at": state.global_step,
            "stopped_early": state.global_step < state.max_steps,
        }
    }
