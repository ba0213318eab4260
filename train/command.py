"""`surgery train`: the click command; parses options into a TrainConfig and calls the API.

The options come from `TrainConfig`'s field metadata (train/options.py). torch and transformers
are imported inside the command, so `surgery --help` stays fast.
"""

from __future__ import annotations

import logging
import os

import click

from train.options import SIZE, config_options


def _setup_logging(quiet: bool) -> None:
    """INFO lines from the wrapper on the main process only (every rank runs this command)."""
    main = os.environ.get("RANK", "0") == "0"
    logger = logging.getLogger("train")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO if main and not quiet else logging.WARNING)


@click.command(context_settings={"show_default": True})
@click.argument("base")
@click.argument("out", type=click.Path(file_okay=False))
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
    base: str, out: str, dry_run: bool, gpus: int, gpu_memory: int, **options
) -> None:
    """Continual pretraining of BASE (folder or Hub id), saved to OUT in BASE's layout.

    OUT holds safetensors with BASE's tensor names, shapes, dtypes and shards, so surgery
    commands accept it. Multi-GPU: `torchrun --nproc-per-node N --no-python surgery train ...`
    (DDP), plus `--fsdp "full_shard auto_wrap"` to shard. `--dry-run` prints whether the run
    fits first.

    \b
    Examples:
      surgery train base out --data madlad/data/sk --max-steps 1000
      surgery train base out --data sk=sk.jsonl:0.8 --data en=en.jsonl:0.2 --mix-until en=0.1
      surgery train base out --data sk/ --freeze 9:28
      surgery train base out --data sk/ --l2sp "9:28=0.05,*=0.001" --ema 0.92
      surgery train base out --data sk/ --lora r=16,alpha=32 --lr 2e-4
      surgery train base out --data sk/ --l2sp 9:28=0.05 --dry-run --gpus 8 --gpu-memory 80GB
    """
    from train.config import TrainConfig

    _setup_logging(not options["progress"])
    config = TrainConfig(base=base, output=out, **options)
    if dry_run:
        from train.memory_plan import plan_memory

        click.echo(plan_memory(config, gpus=gpus, gpu_memory=gpu_memory).table())
        return
    from train.api import train

    path = train(config)
    if os.environ.get("RANK", "0") == "0":
        click.echo(f"saved {path}")
