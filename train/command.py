"""`surgery train`: the click command; parses options into a TrainConfig and calls the API.

torch and transformers are imported inside the command, so `surgery --help` stays fast.
"""

from __future__ import annotations

import logging
import os

import click


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
@click.option(
    "--data",
    "data",
    multiple=True,
    required=True,
    metavar="[NAME=]PATH[:SHARE]",
    help="Training text: .txt, .jsonl, .jsonl.gz (a 'text' field), a folder of them, "
    "or hub:ID[#CONFIG][@SPLIT]. Repeat with shares to mix sources.",
)
@click.option(
    "--mix-until",
    multiple=True,
    metavar="[NAME=]FRACTION",
    help="Keep a source only for this first fraction of steps (bare: the last "
    "--data source); its share goes to the others afterwards.",
)
@click.option("--max-steps", type=int, help="Optimizer steps (or give --max-tokens).")
@click.option("--max-tokens", type=int, help="Token budget, rounded up to whole steps.")
@click.option("--block-size", type=int, help="Tokens per packed block [min(1024, context)].")
@click.option("--batch-size", default=8, help="Blocks per device per micro-batch.")
@click.option("--grad-accum", default=1, help="Micro-batches per optimizer step.")
@click.option("--lr", "learning_rate", default=2e-5, help="Peak learning rate.")
@click.option("--lr-scheduler", default="cosine", help="transformers scheduler name.")
@click.option("--warmup", default=0.0, help="Warmup steps (>= 1) or fraction of steps (< 1).")
@click.option("--weight-decay", default=0.0, help="AdamW weight decay (toward zero).")
@click.option("--max-grad-norm", default=1.0, help="Gradient clipping (0: off).")
@click.option("--freeze", metavar="LAYERS", help="Layers that get no gradient, e.g. 9:28.")
@click.option("--freeze-embeddings", is_flag=True, help="Also freeze embeddings and head.")
@click.option(
    "--l2sp",
    metavar="SPEC",
    help="L2-SP strength lambda toward BASE per layer, e.g. '9:28=0.05,*=0.001' "
    "(penalty lambda/2 * ||w - w0||^2).",
)
@click.option(
    "--ema",
    type=float,
    metavar="ALPHA",
    help="Average weights: theta = ALPHA * theta_prev + (1 - ALPHA) * theta'.",
)
@click.option("--ema-every", default=1, metavar="ETA", help="Steps between EMA averages.")
@click.option(
    "--lora",
    metavar="r=R,alpha=A",
    help="LoRA baseline (merged when saved), e.g. "
    "r=16,alpha=32[,dropout=0.05][,targets=q_proj+v_proj].",
)
@click.option(
    "--dtype",
    default="float32",
    help="Weights dtype while training; the checkpoint is saved in BASE's dtype.",
)
@click.option(
    "--mixed-precision",
    type=click.Choice(["no", "bf16", "fp16"]),
    default="no",
    help="Autocast compute dtype.",
)
@click.option("--gradient-checkpointing", is_flag=True, help="Trade compute for memory.")
@click.option("--seed", default=0, help="Seeds the model, the data mixture and dropout.")
@click.option("--logging-steps", default=10, help="Steps between log lines.")
@click.option("--save-steps", default=500, help="Steps between resumable checkpoints.")
@click.option("--save-total-limit", default=2, help="Resumable checkpoints kept.")
@click.option("--resume", is_flag=True, help="Continue an interrupted run in OUT.")
@click.option("--keep-checkpoints", is_flag=True, help="Keep OUT/checkpoints after success.")
@click.option("--report-to", default="none", help="Trainer integrations: wandb, tensorboard...")
@click.option(
    "--drift-groups",
    metavar="LAYERS",
    help="Layer groups for drift logs, e.g. 0:9,9:28,28:34 [from --freeze/--l2sp, else thirds].",
)
@click.option("--no-drift", is_flag=True, help="Do not log drift from BASE.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def train_command(base: str, out: str, quiet: bool, no_drift: bool, **options) -> None:
    """Continual pretraining of BASE (folder or Hub id), saved to OUT in BASE's layout.

    OUT holds safetensors with BASE's tensor names, shapes, dtypes and shards, so surgery
    commands accept it. Multi-GPU: `torchrun --nproc-per-node N --no-python surgery train ...`.
    """
    from train.api import train
    from train.config import TrainConfig

    _setup_logging(quiet)
    config = TrainConfig(base=base, output=out, drift=not no_drift, progress=not quiet, **options)
    path = train(config)
    if os.environ.get("RANK", "0") == "0":
        click.echo(f"saved {path}")
