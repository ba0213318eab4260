"""`surgery eval`: score a checkpoint on tasks, print a table, write the full result as JSON.

Only click is imported at module level: torch and transformers load when the command runs, so
`surgery --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

HELP = """Score CHECKPOINT (a causal LM folder) on one or more tasks.

Prints a table of metrics; --out writes every metric, its n and the full configuration as JSON.
Task data is read and checked before the model loads. The same seed gives the same JSON.

\b
Task strings (repeat -t/--task), KIND[:PATH][:KEY=VALUE,...]:
  ppl:PATH                  perplexity and bits per byte; PATH is a .txt (blank-line-separated
                            documents), .jsonl or .jsonl.gz file ("text" field), a folder of
                            them, or a MADLAD-400 root (data/<lang>/...): one row per language
  belebele:FILE             Belebele rows, 2-shot by default (shots=K)
  piqa:FILE                 Global-PIQA rows, cloze, 2-shot by default (shots=K)
  flores:DIR:src=L,tgt=L    FLORES+/FLORES-200 chrF; options shots (2), split (devtest),
                            metric (chrf or chrf++), max_new_tokens (256), src_name, tgt_name
  copain                    generated in-context-learning probe, 7 tasks; options shots (5),
                            n (150 items per task), max_new_tokens (16)
Every task also takes name=NAME, its metric prefix (default: the kind).

\b
Examples:
  surgery eval out/reverted -t ppl:madlad/ --limit 200
  surgery eval out/reverted -t belebele:belebele/ind_Latn.jsonl -o ind.json
  surgery eval out/reverted -t piqa:global_piqa/ind_latn.jsonl:shots=2
  surgery eval out/reverted -t flores:flores200_dataset:src=eng_Latn,tgt=ind_Latn
  surgery eval out/reverted -t copain:shots=5 --device cuda --dtype bf16
  surgery eval base -t belebele:b/eng.jsonl:name=bele_eng -t belebele:b/ind.jsonl:name=bele_ind
"""


@click.command(
    "eval", help=HELP, short_help="Score a checkpoint: ppl, Belebele, PIQA, FLORES, Copain."
)
@click.argument("checkpoint")
@click.option("-t", "--task", "tasks", multiple=True, required=True, help="A task string.")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), help="JSON file.")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda, cuda:1, ...")
@click.option("--dtype", help="bf16, fp16 or fp32 [default: fp32 on cpu, bf16 otherwise].")
@click.option("--tokenizer", help="Tokenizer folder, if not in CHECKPOINT.")
@click.option("--batch-size", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--limit", type=click.IntRange(min=1), help="Score only the first N items per task.")
@click.option("--seed", default=0, show_default=True, type=int, help="Demonstrations, Copain.")
@click.option(
    "--max-length",
    type=click.IntRange(min=2),
    help="Longest sequence (ppl window; prompts cut from the left) [default: model context].",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def eval_command(
    checkpoint: str,
    tasks: tuple[str, ...],
    out: Path | None,
    device: str,
    dtype: str | None,
    tokenizer: str | None,
    batch_size: int,
    limit: int | None,
    seed: int,
    max_length: int | None,
    quiet: bool,
) -> None:
    """Run the tasks (see HELP)."""
    from eval.api import evaluate, load_tasks
    from eval.model_loading import load_model

    loaded = load_tasks(list(tasks))
    model, tok = load_model(checkpoint, device, dtype, tokenizer=tokenizer, progress=not quiet)
    result = evaluate(
        model,
        tok,
        loaded,
        batch_size=batch_size,
        limit=limit,
        seed=seed,
        max_length=max_length,
        progress=not quiet,
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
