"""`surgery eval`: score a checkpoint on tasks, print a table, write the full result as JSON.

Only click and the task registry (no torch) are imported at module level: torch and
transformers load when the command runs, so `surgery --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from eval.options import ScoringOptions, check_halves, eval_options, suite_option
from eval.tasks import kinds_help
from surgery.core.cli_paths import OutputFile
from surgery.options import force_option, given, quiet_option

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

\b
A suite (--suite SUITE.yml, instead of -t) names families of languages and tasks with a path
per language (format: docs/study.md); the model loads once, every (task,
language) is scored and -o DIR gets results.json and samples/*.jsonl. Rerun with the same DIR
to continue an interrupted run; under torchrun the units are shared out across ranks.
  surgery eval out/reverted --suite eval/study/suites/paper.yml -o results/reverted
  surgery eval out/reverted --suite study.yml -o results/reverted --fewshot-seeds 1,2,3
  surgery eval out/reverted --suite study.yml -o results/reverted --allow-missing
  surgery eval out/point-3 --suite study.yml -o results/point-3 --half report --split-seed 0
  torchrun --nproc-per-node 8 --no-python surgery eval out/reverted --suite study.yml \\
      -o results/reverted --device cuda
"""


@click.command(
    "eval",
    help=HELP.format(kinds=kinds_help()),
    short_help="Score a checkpoint: ppl, Belebele, PIQA, FLORES, Copain.",
)
@click.argument("checkpoint")
@eval_options
@click.option(
    "-o",
    "--out",
    type=OutputFile(path_type=Path, dir_okay=True),
    help="Where results go: a JSON file (with --suite: the results folder).",
)
@suite_option
@click.option(
    "--fewshot-seeds",
    callback=lambda _ctx, _param, value: parse_seeds(value),
    help="With --suite: repeat few-shot tasks with demonstrations drawn by each seed, e.g. 1,2,3 "
    "(a first_n task runs once as the control beside <task>_rs copies, one per seed).",
)
@click.option(
    "--allow-missing",
    is_flag=True,
    help="With --suite: skip units whose data is missing (listed in results.json).",
)
@click.option("--tokenizer", help="Tokenizer folder, if not in CHECKPOINT.")
@click.option(
    "--log-samples",
    type=OutputFile(path_type=Path),
    help="JSONL file: one line per scored item (context, choices, log-likelihoods, prediction).",
)
@force_option
@click.option(
    "--no-prefix-cache",
    is_flag=True,
    help="Run every multiple-choice context whole, not from the KV cache of the token prefix "
    "they share (the same scores; for debugging).",
)
@quiet_option
def eval_command(
    checkpoint: str,
    tasks: tuple[str, ...],
    scoring: ScoringOptions,
    out: Path | None,
    tokenizer: str | None,
    log_samples: Path | None,
    force: bool,
    no_prefix_cache: bool,
    quiet: bool,
    suite: str | None,
    fewshot_seeds: tuple[int, ...],
    allow_missing: bool,
) -> None:
    """Run the tasks (see HELP)."""
    from surgery.engine.output_paths import check_output_files, check_resumable_folder
    from surgery.hub.resolve import check_input

    if suite is not None:
        if no_prefix_cache:
            raise click.UsageError("--no-prefix-cache goes with -t/--task, not --suite")
        _check_suite_options(tasks, out, log_samples)
        check_input(checkpoint)
        check_resumable_folder(out)  # a results folder a rerun continues, never in a checkpoint
        check_halves(scoring, with_suite=True)
        from eval.study.results import read_results
        from eval.study.runner import run_suite
        from eval.study.scoring import suite_run
        from eval.study.summary import suite_table

        run = suite_run(
            scoring.resolved(),
            fewshot_seeds=fewshot_seeds,
            allow_missing=allow_missing,
            tokenizer=tokenizer,
            progress=not quiet,
            warn=lambda line: click.echo(f"warning: {line}", err=True),
        )
        written = run_suite(checkpoint, Path(suite), out, run)
        if written is not None:
            click.echo(suite_table(read_results(written.parent)))
            click.echo(f"wrote {written}")
        return
    if fewshot_seeds or allow_missing or scoring.half or given("split_seed"):
        raise click.UsageError(
            "--fewshot-seeds, --allow-missing, --half and --split-seed go with --suite"
        )
    if not tasks:
        raise click.UsageError("give at least one task with -t/--task, e.g. -t copain")
    if out is not None and out.is_dir():
        raise click.UsageError(f"-o {out}: a folder; without --suite, -o names a JSON file")
    inputs = [checkpoint] if tokenizer is None else [checkpoint, tokenizer]
    for spec in inputs:
        check_input(spec)  # a mistyped folder fails now, before torch, the data or the network
    check_output_files([out, log_samples], inputs, force)
    from eval.api import score_checkpoint

    result = score_checkpoint(
        checkpoint,
        tasks,
        scoring,
        tokenizer=tokenizer,
        progress=not quiet,
        log_samples=log_samples,
        prefix_cache=not no_prefix_cache,
    )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    click.echo(format_table(result["metrics"]))


def parse_seeds(text: str | None) -> tuple[int, ...]:
    """``1,2,3`` -> (1, 2, 3): distinct integers.

    Raises:
        click.BadParameter: not comma-separated integers, or one given twice.
    """
    if text is None:
        return ()
    try:
        seeds = tuple(int(piece) for piece in text.split(","))
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: expected comma-separated integers, e.g. 1,2,3"
        ) from None
    if len(set(seeds)) != len(seeds):
        raise click.BadParameter(f"{text!r}: a seed is given twice")
    return seeds


def _check_suite_options(tasks: tuple[str, ...], out: Path | None, log: Path | None) -> None:
    if tasks:
        raise click.UsageError("--suite names the tasks; give --suite or -t/--task, not both")
    if out is None:
        raise click.UsageError("--suite needs -o DIR, the results folder")
    if out.exists() and not out.is_dir():
        raise click.UsageError(f"-o {out}: a file; --suite writes a results folder")
    if log is not None:
        raise click.UsageError("--suite writes every unit's samples under DIR/samples/")


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
