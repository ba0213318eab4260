"""`surgery compare`: the strategies' suite results against the base's, item by item."""

from __future__ import annotations

from pathlib import Path

import click

from surgery.core.cli_paths import OutputFolder
from surgery.options import force_option, quiet_option, wrote


@click.command()
@click.argument("dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--base",
    required=True,
    type=click.Path(path_type=Path),
    help="The base model's results folder (`surgery eval BASE --suite ... -o DIR`).",
)
@click.option(
    "-o", "--out", required=True, type=OutputFolder(path_type=Path), help="Report folder."
)
@click.option(
    "--resamples",
    default=10_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Bootstrap resamples B.",
)
@click.option("--seed", default=0, show_default=True, help="Seed of the resamples (recorded).")
@click.option(
    "--jobs", type=click.IntRange(min=1), default=None, help="Processes [default: the usable CPUs]."
)
@click.option(
    "--bold",
    type=click.Choice(["interval", "adjusted"]),
    default="interval",
    show_default=True,
    help="Bold a change whose unadjusted 95% interval excludes 0, or only one that survives "
    "Benjamini-Hochberg over its table († marks the latter either way).",
)
@force_option
@quiet_option
def compare(dirs, base, out, resamples, seed, jobs, force, quiet, bold):
    """Compare strategies' suite results (DIRS) with the base's, item by item.

    Per family the mean over held-in and over held-out languages, overall the mean over
    families, and the mean over the suite's `others:` languages (forgetting); changes from the
    base with paired bootstrap 95% intervals, Benjamini-Hochberg over each table, sign tests
    over languages and families. Writes OUT/report.md, comparison.csv, comparison.json and two
    plots. Results of other suites, settings, data or prompts are refused.

    \b
    Examples:
      surgery compare runs/dense runs/soup --base runs/base -o report
      surgery compare runs/* --base runs/base -o report --resamples 2000 --seed 1
    """
    from eval.study.api import compare_into
    from eval.study.compare import default_jobs

    comparison, notes = compare_into(
        base,
        list(dirs),
        out,
        resamples=resamples,
        seed=seed,
        jobs=jobs or default_jobs(),
        bold=bold,
        force=force,
        progress=not quiet,
    )
    for warning in comparison.warnings:
        click.echo(f"warning: {warning}", err=True)
    for note in notes if not quiet else ():
        click.echo(note, err=True)
    wrote(out, quiet)
