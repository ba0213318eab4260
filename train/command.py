"""`surgery train`: the click command; parses options into a TrainConfig and calls the API.

The options come from `TrainConfig`'s field metadata (train/options.py). torch and transformers
are imported inside the command, so `surgery --help` stays fast. The eval tasks of
`--eval-every N -t TASK` come from above (`EvalHook`, given by cli.py): train never imports eval.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from surgery.core.cli_paths import OutputFolder
from surgery.options import renamed
from train.options import SIZE, config_options

if TYPE_CHECKING:
    from train.periodic_eval import Scorer


@dataclass(frozen=True)
class EvalHook:
    """What `surgery train --eval-every` takes from the eval wrapper.

    Attributes:
        options: a click decorator adding the eval wrapper's `-t/--task` option (its value
            arrives as `tasks`) and its scoring options under `--eval-*` names (their value
            arrives whole as `eval_scoring`), so train spells them as eval, sweep and localize do
            without colliding with its own --batch-size and --seed.
        make_scorer: `make_scorer(tasks, eval_scoring) -> score(model, tokenizer)`; checks the
            task strings and reads their data when called, so a typo fails before training.
    """

    options: Callable[[Callable], Callable]
    make_scorer: Callable[[Sequence[str], Any], Scorer]


def _setup_logging(quiet: bool) -> None:
    """INFO lines from the wrapper on the main process only (every rank runs this command)."""
    main = os.environ.get("RANK", "0") == "0"
    logger = logging.getLogger("train")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO if main and not quiet else logging.WARNING)


def build_train_command(evaluation: EvalHook | None = None) -> click.Command:
    """The `surgery train` command; with `evaluation`, it also takes `-t/--task`.

    Args:
        evaluation: the eval wrapper's task option and scorer factory (see `EvalHook`).

    Returns:
        The click command.
    """

    @click.command("train", context_settings={"show_default": True})
    @click.argument("base")
    @click.argument("out", type=OutputFolder(file_okay=False))
    @config_options
    @click.option(
        "--dry-run",
        is_flag=True,
        help="Print the memory plan per GPU (DDP and FSDP) from BASE's config.json and stop; "
        "no weights or data are read.",
    )
    @click.option("--gpus", type=click.IntRange(min=1), default=8, help="GPUs for --dry-run.")
    @click.option("--gpu-memory", type=SIZE, default="80GB", help="Memory per GPU for --dry-run.")
    def train_command(
        base: str,
        out: str,
        dry_run: bool,
        gpus: int,
        gpu_memory: int,
        tasks: Sequence[str] = (),
        eval_scoring: Any = None,
        **options,
    ) -> None:
        """Continual pretraining of BASE (folder or Hub id), saved to OUT in BASE's layout.

        OUT holds safetensors with BASE's tensor names, shapes, dtypes and shards, so surgery
        commands accept it. An existing OUT is refused unless --resume (it holds only
        OUT/checkpoints of an interrupted run: continue) or --force (replace it when the new
        checkpoint is saved); OUT is never inside BASE or a --data source. Multi-GPU:
        `torchrun --nproc-per-node N --no-python surgery train ...` (DDP), plus
        `--fsdp "full_shard auto_wrap"` to shard. `--dry-run` prints whether the run fits first.
        `--eval-every N -t TASK` scores eval tasks (grammar: surgery eval --help) every N steps
        on the model being trained, logged as eval/<metric> beside the loss.

        \b
        Examples:
          surgery train base out --data madlad/data/sk --max-steps 1000
          surgery train base out --data sk=sk.jsonl:0.8 --data en=en.jsonl:0.2 --mix-until en=0.1
          surgery train base out --data sk/ --freeze 9:28
          surgery train base out --data sk/ --l2sp "9:28=0.05,*=0.001" --ema 0.92
          surgery train base out --data sk/ --lora r=16,alpha=32 --lr 2e-4
          surgery train base out --data sk/ --eval-every 200 -t ppl:en-heldout.txt -t copain:n=20
          surgery train base out --data sk/ --max-steps 1000 --force     # replace an old out
          surgery train base out --data sk/ --max-steps 1000 --resume    # after an interruption
          surgery train base out --data sk/ --l2sp 9:28=0.05 --dry-run --gpus 8 --gpu-memory 80GB
        """
        from train.config import TrainConfig

        if (options["eval_every"] is None) != (not tasks):
            raise click.UsageError("--eval-every N and -t/--task TASK go together")
        _setup_logging(not options["progress"])
        config = TrainConfig.from_options(base=base, output=out, eval_tasks=tuple(tasks), **options)
        if dry_run:
            from train.memory_plan import plan_memory

            click.echo(plan_memory(config, gpus=gpus, gpu_memory=gpu_memory).table())
            return
        from train.api import train

        # The tasks' strings and data are checked now, before any weight is loaded.
        score = evaluation.make_scorer(tuple(tasks), eval_scoring) if tasks and evaluation else None
        path = train(config, score=score)
        if os.environ.get("RANK", "0") == "0":
            click.echo(f"saved {path}")

    # The old spelling of --train-dtype, until the next release (it means a written dtype now).
    train_command.callback = renamed("--dtype", "--train-dtype", "dtype")(train_command.callback)
    if evaluation is not None:
        train_command.callback = evaluation.options(train_command.callback)
    # click appends the parameters these add to the command's own.
    train_command.params += getattr(train_command.callback, "__click_params__", [])[::-1]
    return train_command
