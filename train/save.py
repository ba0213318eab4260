"""The recipe's last step: full weights written in BASE's layout, with the run's record."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from train.checkpoint_io import to_base_layout, write_checkpoint
from train.fields import flatten
from train.outputs import carried_entries
from train.sharding import full_state_dict

if TYPE_CHECKING:
    from train.config import TrainPlan
    from train.trainer import SurgeryTrainer

logger = logging.getLogger(__name__)


def save(trainer: SurgeryTrainer, plan: TrainPlan) -> None:
    """Gather full weights, write them in BASE's layout on the main process.

    The engine writes the checkpoint beside OUT and then replaces OUT (and with it the
    resumable checkpoints, unless kept) in one rename; with --force, also an OUT that another
    run left or created meanwhile.

    Args:
        trainer: the trainer after training.
        plan: the run's plan (its configuration is recorded in `surgery_train.json`, with each
            strategy's record).
    """
    cfg, output = plan.config, plan.output
    main = trainer.is_world_process_zero()
    record = _record(trainer, plan) if main else {}
    model = trainer.accelerator.unwrap_model(trainer.model)
    # A collective under FSDP: every rank gathers tensor by tensor, only the main one keeps them.
    state_dict = full_state_dict(model, keep=main) if trainer.is_fsdp_enabled else None
    model, state_dict = plan.strategies.weights(model, state_dict, main)  # LoRA merged
    if main:
        checkpoints = Path(trainer.args.output_dir)  # the resumable checkpoints
        carry = carried_entries(checkpoints, output, cfg.keep_checkpoints, cfg.force)
        weights = state_dict if state_dict is not None else model.state_dict()  # no FSDP
        tensors = to_base_layout(model, weights, plan.layout)
        replace = cfg.force or None
        write_checkpoint(
            output,
            plan.layout,
            tensors,
            record,
            carry=carry,
            replace=replace,
            quiet=not cfg.progress,
        )
        logger.debug("saved %s", output)  # the command says it, once
    trainer.accelerator.wait_for_everyone()
    # Let the next run in this process (tests, pipelines) start without a stale process group.
    if os.environ.get("WORLD_SIZE", "1") == "1":
        trainer.accelerator.free_memory()


def _record(trainer: SurgeryTrainer, plan: TrainPlan) -> dict:
    """The run's record, written as `surgery_train.json` (all of it but the log history is also
    the recipe's)."""
    strategies: dict = {}
    for strategy in plan.strategies:
        strategies.update(strategy.record(trainer))
    return {
        "config": flatten(plan.config),  # flat, by flag name, as `from_options` takes it
        "steps": trainer.state.global_step,
        "tokens": trainer.args.max_steps * trainer.tokens_per_step,
        "world_size": trainer.args.world_size,
        "global_batch_blocks": trainer.global_batch_blocks,
        "sharded": trainer.is_fsdp_enabled,
        "threads": torch.get_num_threads(),  # the thread rule's choice, on the main process
        # What the strategies hold on the main process (one shard of each under FSDP).
        "held_bytes_rank0": trainer.held_bytes,
        **strategies,
        "log_history": trainer.state.log_history,
    }
