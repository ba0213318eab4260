"""transformers' TrainingArguments for a run, from its configuration."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from train.errors import TrainConfigError

if TYPE_CHECKING:
    from transformers import TrainingArguments

    from train.config import TrainConfig

logger = logging.getLogger(__name__)


def training_arguments(
    cfg: TrainConfig, checkpoints_dir: Path, overrides: Mapping[str, Any] | None = None
) -> TrainingArguments:
    """transformers TrainingArguments for the run (max_steps is set once the world is known).

    Args:
        cfg: the run's configuration (its general options).
        checkpoints_dir: where the Trainer keeps its resumable checkpoints.
        overrides: the strategies' keywords (`Strategies.arguments`), over the general ones
            (early stopping saves at its scored steps instead of every `--save-steps`).
    """
    import torch
    from transformers import TrainingArguments

    warmup = int(cfg.warmup) if cfg.warmup >= 1 else cfg.warmup
    report_to = [r.strip() for r in cfg.report_to.split(",") if r.strip()] or ["none"]
    has_accelerator = hasattr(torch, "accelerator") and torch.accelerator.is_available()
    return TrainingArguments(
        output_dir=str(checkpoints_dir),
        max_steps=cfg.max_steps or 1,
        per_device_train_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.grad_accum,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=warmup,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        bf16=cfg.mixed_precision == "bf16",
        fp16=cfg.mixed_precision == "fp16",
        activation_checkpointing=cfg.gradient_checkpointing or None,
        seed=cfg.seed,
        logging_steps=cfg.logging_steps,
        logging_first_step=True,
        save_strategy="steps",
        save_total_limit=cfg.save_total_limit,
        report_to=report_to,
        disable_tqdm=not cfg.progress,
        use_cpu=not has_accelerator,
        dataloader_num_workers=0,
        **_fsdp_arguments(cfg.fsdp, cfg.fsdp_config),
        **{"save_steps": cfg.save_steps, **(overrides or {})},
        **cfg.extra_args,
    )


def _fsdp_arguments(fsdp: str | None, fsdp_config: str | None) -> dict:
    """transformers' `fsdp` and `fsdp_config` keywords for `--fsdp` (FSDP2 unless the config
    file says otherwise)."""
    import json

    if not fsdp:
        return {}
    settings: dict = {"version": 2}
    if fsdp_config:
        try:
            settings.update(json.loads(Path(fsdp_config).read_text()))
        except (OSError, ValueError) as error:
            raise TrainConfigError(f"--fsdp-config {fsdp_config}: {error}") from None
    return {"fsdp": fsdp, "fsdp_config": settings}


def single_device_instead_of_data_parallel(args: TrainingArguments) -> bool:
    """Run on one device where the Trainer would fall back to DataParallel (several GPUs, one
    process, no torchrun).

    DataParallel splits each batch over the GPUs of one process: a different global batch
    than the one the run was planned for, and the torchrun path is the one that scales. So the
    run uses one device and says how to use them all.

    Returns:
        True when the device count was lowered to one (a warning was logged).
    """
    from transformers.training_args import ParallelMode

    if args.n_gpu <= 1 or args.parallel_mode != ParallelMode.NOT_DISTRIBUTED:
        return False
    logger.warning(
        "%d GPUs but one process: training on one GPU; for all of them run "
        "`torchrun --nproc-per-node %d --no-python surgery train ...`",
        args.n_gpu,
        args.n_gpu,
    )
    args._n_gpu = 1  # the Trainer reads n_gpu to decide on DataParallel and the batch size
    return True
