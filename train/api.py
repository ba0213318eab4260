"""The Python entry point: `train(TrainConfig(...)) -> Path` of the saved checkpoint.

Usable from other commands (a demo pipeline) and under `torchrun` / `accelerate launch`: every
rank runs the same function; the main process writes the checkpoint.

`train` is the recipe, one step per module: the configuration is validated once into a plan
(train/config.py), then load (train/load.py), prepare (freeze, LoRA: train/prepare.py), the
Trainer (train/assemble.py) and its strategies (L2-SP, drift, EMA, early stopping:
train/attach.py), training, and save (train/save.py). Each step after validation is handed the
plan; the strategies (train/strategies/, one module each) act through their hooks in each step.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from train.config import TrainConfig
from train.errors import TrainConfigError
from train.strategies import STRATEGIES

if TYPE_CHECKING:
    from transformers import TrainerCallback

    from train.periodic_eval import Scorer

logger = logging.getLogger(__name__)


def train(
    config: TrainConfig, callbacks: Sequence[TrainerCallback] = (), score: Scorer | None = None
) -> Path:
    """Validate `config`, train, and save a checkpoint in the base's layout.

    A run that fails or is interrupted (Ctrl-C, SIGTERM) leaves no empty OUT/checkpoints, only
    the resumable checkpoints it saved, and says so.

    Args:
        config: the run's configuration.
        callbacks: extra `TrainerCallback`s, called after the wrapper's own (so on_step_end
            sees the weights after the EMA average).
        score: `score(model, tokenizer) -> {metric: value}`, called every `config.eval_every`
            optimizer steps on the model being trained (in eval mode, without gradients); the
            values are logged as `eval/<metric>`. Required with `eval_every`, else not allowed.
            `surgery train -t TASK` builds it from the eval wrapper's tasks.

    Returns:
        The output folder, holding safetensors shards named and typed like BASE, its config
        and tokenizer files, and `surgery_train.json` (the configuration used).

    Raises:
        SurgeryError: any problem with the request (see `TrainConfig.validate`).
    """
    from transformers import set_seed

    from train.assemble import assemble
    from train.attach import attach
    from train.load import load
    from train.outputs import discard_old_checkpoints, kept_on_failure
    from train.prepare import prepare
    from train.save import save

    if (config.eval_every is None) != (score is None):
        raise TrainConfigError("eval_every and a score function go together: give both or neither")
    chosen = strategies(config)  # the line is said once BASE and the options check out
    plan = config.validate()
    logger.info("%s", chosen)
    with kept_on_failure(plan.checkpoints_dir, plan.output):
        discard_old_checkpoints(plan.checkpoints_dir, plan.discard_checkpoints)
        set_seed(config.seed)
        model, tokenizer, layers = load(
            plan.layout,
            plan.dtype,
            plan.strategies.modules,
            attention_only=plan.strategies.attention_only,
            progress=config.progress,
        )
        model = prepare(model, layers, plan.strategies, plan.layout.text_stack)
        trainer, dataset = assemble(plan, model, tokenizer)
        own = attach(trainer, layers, plan, score)
        for callback in [*own, *callbacks]:
            trainer.add_callback(callback)
        trainer.train(resume_from_checkpoint=str(plan.resume_from) if plan.resume_from else None)
        for note in dataset.rerun_notes():
            logger.warning("%s", note)
        save(trainer, plan)
    return plan.output


def strategies(config: TrainConfig) -> str:
    """One line saying which strategies against forgetting the run uses: each strategy's flags
    (registry order), then the options that shape them (--modules, --attention-only, --fsdp)."""
    chosen = [item for strategy in STRATEGIES for item in strategy.summary(config)]
    for flag, value in (
        ("--modules", config.modules),
        ("--attention-only", "" if config.attention_only else None),
        ("--fsdp", config.fsdp),
    ):
        if value is not None:
            chosen.append(f"{flag} {value}")
    return "strategies: " + (", ".join(c.strip() for c in chosen) or "plain continual pretraining")
