"""The recipe's third step: the Trainer, its arguments and the data it reads, sized exactly."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from train.arguments import single_device_instead_of_data_parallel, training_arguments
from train.data import MixtureSchedule, PackedMixture

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from train.config import TrainPlan
    from train.trainer import SurgeryTrainer

logger = logging.getLogger(__name__)


def assemble(
    plan: TrainPlan, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> tuple[SurgeryTrainer, PackedMixture]:
    """Build the Trainer over the packed mixture of the plan's sources, in blocks of its size.

    Returns:
        The trainer (its `tokens_per_step` and `global_batch_blocks` set) and its dataset.
    """
    from transformers import default_data_collator

    from train.trainer import SurgeryTrainer

    cfg, sources, block = plan.config, plan.sources, plan.block_size
    overrides = plan.strategies.arguments()
    args = training_arguments(cfg, plan.checkpoints_dir, overrides)
    single_device_instead_of_data_parallel(args)
    if cfg.fsdp and args.world_size == 1:
        logger.warning("--fsdp with one process: nothing to shard; start it with torchrun")
    # The Trainer's own global batch: blocks per device x devices per process x accumulation x
    # processes. The schedule holds exactly this many blocks per step, so the data is never
    # started over and the token count is exact.
    per_step = args.train_batch_size * cfg.grad_accum * args.world_size
    steps = cfg.max_steps or math.ceil(cfg.max_tokens / (per_step * block))
    args.max_steps = steps
    shares, until = [s.share for s in sources], [s.until for s in sources]
    schedule = MixtureSchedule(shares, until, steps, per_step, cfg.seed)
    dataset = PackedMixture(sources, tokenizer, block, schedule, cfg.shuffle_buffer)
    evaluates = args.eval_strategy != "no"  # --early-stopping's best-model machinery
    trainer = SurgeryTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=default_data_collator,
        processing_class=tokenizer,
        # The Trainer evaluates only with a dataset; the scores come from PeriodicEval instead.
        eval_dataset=() if evaluates else None,
    )
    trainer.tokens_per_step = per_step * block
    trainer.global_batch_blocks = per_step
    if evaluates:
        tasks = ", ".join(cfg.eval_tasks) or "the given scorer"
        logger.info("held-out scores every %d steps: %s", cfg.eval_every, tasks)
    logger.info(
        "training %d steps x %d blocks of %d tokens on %d process(es)",
        steps,
        per_step,
        block,
        args.world_size,
    )
    return trainer, dataset
