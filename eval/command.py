"""`surgery eval`: score a checkpoint on tasks, print a table, write the full result as JSON.

Only click and the task registry (no torch) are imported at module level: torch and
transformers load when the command runs, so `surgery --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from eval.options import eval_options
from eval.tasks import kinds_help

HELP = """Score CHECKPOINT (a causal LM folder) on one or more tasks.

Prints a table of metrics; --out writes every metric, its n and the full configuration as JSON.
Task data is read and checked before the model loads. The same seed gives the same JSON.

\b
Task strings (repeat -t/--task), KIND[:ARGUMENT][:KEY=VALUE,...]:
{kinds}

\b
Examples:
  surgery eval out/reverted -t ppl:madlad/ --limit 200
  surgery eval out/reverted -t belebele:belebele/ind_Latn.jsonl -o ind.json
  surgery eval out/reverted -t piqa:global_piqa/ind_latn.jsonl:shots=2
  surgery eval out/reverted -t flores:flores200_dataset:src=eng_Latn,tgt=ind_Latn
  surgery eval out/reverted -t copain:shots=5 --device cuda --eval-dtype bf16
  surgery eval base -t belebele:b/eng.jsonl:name=bele_eng -t belebele:b/ind.jsonl:name=bele_ind
"""


@click.command(
    "eval",
    help=HELP.format(kinds=kinds_help()),
    short_help="Score a checkpoint: ppl, Belebele, PIQA, FLORES, Copain.",
)
@click.argument("checkpoint")
@eval_options
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), help="JSON file.")
@click.option("--tokenizer", help="Tokenizer folder, if not in CHECKPOINT.")
@click.option(
    "--log-samples",
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSONL file: one line per scored item (context, choices, log-likelihoods, prediction).",
)
@click.option(
    "--no-prefix-cache",
    is_flag=True,
    help="Run every multiple-choice context whole, not from the KV cache of the token prefix "
    "they share (the same scores; for debugging).",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def eval_command(
    checkpoint: str,
    tasks: tuple[str, ...],
    eval_options: dict[str, Any],
    out: Path | None,
    tokenizer: str | None,
    log_samples: Path | None,
    no_prefix_cache: bool,
    quiet: bool,
) -> None:
    """Run the tasks (see HELP)."""
    from eval.api import evaluate, load_tasks
    from eval.model_loading import load_model

    if not tasks:
        raise click.UsageError("give at least one task with -t/--task, e.g. -t copain")
    options = dict(eval_options)
    device, dtype = options.pop("device"), options.pop("dtype")
    loaded = load_tasks(list(tasks))
    model, tok = load_model(checkpoint, device, dtype, tokenizer=tokenizer, progress=not quiet)
    result = evaluate(
        model,
        tok,
        loaded,
        progress=not quiet,
        log_samples=log_samples,
        prefix_cache=not no_prefix_cache,
        **options,
    )
    result["config"]["model"] = checkpoint
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    click.echo(format_table(result["metrics"]))


def format_table(metrics: dict[str, float | int]) -> str:
    """A compact table: one row per metric, with the n of its task (or language, or sub-task).

    Args:
        metrics: flat metrics as `evaluate` returns them.

    Returns:
        The table as text.
    """
    rows = [("metric", "value", "n")]
    for key, value in metrics.items():
        group, _, last = key.rpartition("/")
        if last == "n":
            continue
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        rows.append((key, shown, str(metrics.get(f"{group}/n", ""))))
    width = max(len(row[0]) for row in rows)
    value_width = max(len(row[1]) for row in rows)
    return "\n".join(f"{k:<{width}}  {v:>{value_width}}  {n:>6}" for k, v, n in rows)
