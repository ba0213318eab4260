"""`surgery drift`: how far one model moved from its base, or how alike several experts'
task vectors are (both streamed: the models are never loaded whole)."""

from __future__ import annotations

import click

from surgery.core.cli_paths import OutputFile
from surgery.options import download_option, force_option, quiet_option, renamed, stack_option


@click.command()
@stack_option
@click.option(
    "--csv",
    "csv_path",
    type=OutputFile(),
    help="Per-tensor rows (one expert) or per-pair rows (several) as CSV.",
)
@click.option(
    "--plot",
    type=OutputFile(),
    help="One expert: bar chart of drift over layers; several: N x N cosine heatmaps per region "
    "(.png, .pdf or .svg).",
)
@click.option(
    "--json-file", "json_path", type=OutputFile(), help="Several experts: every matrix as JSON."
)
@renamed("--json", "--json-file", "json_path", type=OutputFile())
@click.option(
    "--pair-plot",
    type=OutputFile(),
    help="Several experts: heatmap of one pair's cosine per layer and module kind (see --pair).",
)
@click.option(
    "--pair", default=None, help="The pair of --pair-plot: two labels or positions (default 0,1)."
)
@click.option("--labels", default=None, help="Several experts: their names, comma-separated.")
@force_option
@quiet_option
@download_option
@click.argument("base", type=click.Path())
@click.argument("experts", nargs=-1, required=True, type=click.Path(), metavar="TRAINED...")
def drift(
    stack, csv_path, plot, json_path, pair_plot, pair, labels, force, quiet, download, base, experts
):
    """How far TRAINED moved from BASE: relative L2 and cosine per layer and module kind.

    With two or more TRAINED models (experts of one BASE): the cosine similarity and L2 distance
    between every pair of task vectors (expert - BASE), per layer and module kind, and N x N
    matrices per region (early, middle, late thirds of the layers).

    Streamed: the models are never loaded whole.

    \b
    Examples:
      surgery drift base trained
      surgery drift base trained --csv drift.csv --plot drift.png
      surgery drift base slavic germanic indic --json-file sim.json --plot regions.png
      surgery drift base slavic germanic indic --pair-plot pair.png --pair slavic,indic
    """
    from surgery.engine.output_paths import check_output_files

    # Before any input is read: a bad output path costs nothing and writes nothing.
    check_output_files([csv_path, plot, json_path, pair_plot], [base, *experts], force)
    several = len(experts) > 1
    extra = {"--json-file": json_path, "--pair-plot": pair_plot, "--pair": pair, "--labels": labels}
    given = [name for name, value in extra.items() if value is not None]
    if given and not several:
        raise click.UsageError(f"{', '.join(given)}: only with two or more TRAINED models")
    from surgery.diagnostics.drift_run import run_drift, run_similarity

    common = dict(stack=stack, csv_path=csv_path, plot=plot, quiet=quiet, download=download)
    if not several:
        from surgery.diagnostics.drift import format_drift

        click.echo(format_drift(run_drift(base, experts[0], **common)))
        return
    from surgery.diagnostics.similarity_report import format_similarity

    more = dict(json_path=json_path, pair_plot=pair_plot, pair=pair, labels=labels)
    click.echo(format_similarity(run_similarity(base, list(experts), **common, **more)))
