"""`surgery sweep` and `surgery localize`: blends by surgery's diagnostics, scored by eval."""

from __future__ import annotations

from pathlib import Path

import click

from diagnose.scorers import scorer_for
from eval.options import check_halves, eval_options, suite_option
from surgery.core.cli_paths import OutputFolder
from surgery.options import (
    blocks_option,
    extrapolate_option,
    finish,
    force_option,
    given,
    modules_option,
    out_option,
    quiet_option,
    renamed,
    stack_option,
    write_options,
    wrote,
)


@click.command()
@click.option(
    "--alphas",
    "grid",
    default="0:1:0.1",
    show_default=True,
    help="The alphas: start:stop:step (stop included on the grid) or a list 0,0.5,1.",
)
@renamed("--alpha", "--alphas", "grid")
@click.option("--layers", default=None, help="Blend only these layers; others from TRAINED.")
@stack_option
@modules_option
@extrapolate_option
@click.option("--no-save", is_flag=True, help="Do not keep a checkpoint per alpha (needs -t).")
@click.option(
    "--in-memory/--write-and-reload",
    default=None,
    help="How to score points [default: in memory when the model fits].",
)
@eval_options
@suite_option
@out_option("Results folder: sweep.csv, sweep.json, sweep.png and the alpha-X.XX checkpoints.")
@write_options("max_shard_size", "force", "quiet")
@click.argument("base", type=click.Path())
@click.argument("trained", type=click.Path())
@renamed("OUT_DIR", "-o/--out", "out", type=OutputFolder(path_type=Path))
def sweep(
    grid,
    layers,
    stack,
    modules,
    extrapolate,
    no_save,
    in_memory,
    tasks,
    write,
    base,
    trained,
    out,
    scoring,
    suite,
):
    """Interpolate BASE -> TRAINED at every alpha; save alpha-X.XX checkpoints and/or score them.

    Writes into the folder -o/--out: a checkpoint per alpha (alpha-X.XX, unless --no-save) and,
    with -t/--task (or --suite), sweep.csv, sweep.json and sweep.png (each metric against alpha);
    alpha 0 is BASE and alpha 1 is TRAINED, bit for bit.

    \b
    Examples:
      surgery sweep --alphas 0:1:0.25 base trained -o sweep/
      surgery sweep --alphas 0:1:0.1 --layers 9:28 base trained -o sweep/ -t copain --no-save
      surgery sweep --alphas 0,0.5,1 base trained -o sweep/ -t ppl:madlad/ -t belebele:b.jsonl
      surgery sweep --alphas 0:1:0.25 base trained -o sweep/ --suite study.yml --no-save
    """
    from surgery.diagnostics.sweep import parse_alpha_grid, run_sweep

    check_halves(scoring, bool(suite))
    if out is None:
        raise click.UsageError("give -o/--out DIR, the sweep's folder")
    scoring_on = bool(tasks) or bool(suite)
    rows = run_sweep(
        base,
        trained,
        out,
        parse_alpha_grid(grid),
        layers=layers,
        stack=stack,
        modules=modules,
        scorer=scorer_for(tasks, scoring, suite, trained) if scoring_on else None,
        save=not no_save,
        in_memory=in_memory,
        extrapolate=extrapolate,
        write=write,
    )
    if scoring_on:
        from surgery.diagnostics.results import format_table, metric_names

        click.echo(format_table(rows, ["alpha", *metric_names(rows)]))
    finish(Path(out), write)


@click.command()
@blocks_option
@click.option(
    "--block-width", type=int, default=None, help="Or consecutive blocks of this many layers."
)
@renamed("--block-size", "--block-width", "block_width", type=int)
@click.option(
    "--window", type=int, default=None, help="Or overlapping windows of this width (e.g. 6)."
)
@click.option(
    "--stride", type=int, default=None, help="Step between windows' first layers [default: 1]."
)
@click.option(
    "--boundaries",
    default=None,
    help="Or bands given as FIRST,LAST;...: keep the first F and last L layers, revert the rest.",
)
@click.option(
    "--alphas",
    default="0",
    show_default=True,
    help="Blend of each block toward TRAINED while scoring (0 = full revert), e.g. 0,0.5.",
)
@stack_option
@modules_option
@out_option("Results folder: localize.csv, localize.json and localize.png.", default="localize")
@renamed("--out-dir", "-o/--out", "out", type=OutputFolder(path_type=Path))
@force_option
@eval_options
@suite_option
@quiet_option
@click.argument("base", type=click.Path())
@click.argument("trained", type=click.Path())
def localize(
    blocks,
    block_width,
    window,
    stride,
    boundaries,
    alphas,
    stack,
    modules,
    out,
    force,
    tasks,
    scoring,
    suite,
    quiet,
    base,
    trained,
):
    """Revert one block of layers at a time to BASE and score: which block carries each metric?

    Recovery = (score - TRAINED's) / (BASE's - TRAINED's): 1 means reverting the block alone gives
    BASE's score. Prints a table and the best block per metric; writes a heatmap (with --window,
    each metric's score against the window's centre) into -o/--out. Windows and bands:
    docs/localization.md.

    \b
    Examples:
      surgery localize base trained --blocks 0:9,9:28,28:34 -t belebele:b.jsonl -t copain
      surgery localize base trained --block-width 4 --alphas 0,0.5 -t ppl:madlad/
      surgery localize base trained --window 6 --stride 1 -t belebele:b.jsonl
      surgery localize base trained --boundaries "9,6;6,6;12,6" -t ppl:madlad/
      surgery localize base trained --blocks 0:9,9:28,28:34 --suite study.yml -o localize/
    """
    from surgery.diagnostics.blocks import parse_block_plan
    from surgery.diagnostics.localize import format_localization, run_localize
    from surgery.diagnostics.sweep import parse_alpha_grid

    check_halves(scoring, bool(suite))
    if not tasks and not suite:
        raise click.UsageError("localize needs at least one -t/--task, or --suite")
    if not given("blocks") and any(v is not None for v in (block_width, window, boundaries)):
        blocks = None  # the default --blocks gives way to another way of forming blocks
    parse_block_plan(blocks, block_width, window, stride, boundaries)  # before any data is read
    result = run_localize(
        base,
        trained,
        scorer_for(tasks, scoring, suite, trained),
        blocks=blocks,
        block_size=block_width,
        window=window,
        stride=stride,
        boundaries=boundaries,
        alphas=parse_alpha_grid(alphas),
        stack=stack,
        modules=modules,
        quiet=quiet,
        out_dir=out,
        force=force,
    )
    click.echo(format_localization(result))
    wrote(Path(out), quiet)


COMMANDS = [sweep, localize]
