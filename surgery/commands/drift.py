"""`surgery drift`: how far one model moved from its base, or how alike several experts'
task vectors are (both streamed: the models are never loaded whole)."""

from __future__ import annotations

from pathlib import Path

import click

from surgery.core.cli_paths import OutputFile
from surgery.core.errors import SurgeryError
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
    common = dict(stack=stack, csv_path=csv_path, plot=plot, quiet=quiet, download=download)
    if not several:
        _drift_one(base, experts[0], **common)
        return
    more = dict(json_path=json_path, pair_plot=pair_plot, pair=pair, labels=labels)
    _similarity(base, list(experts), **common, **more)


def _drift_one(base, trained, *, stack, csv_path, plot, quiet, download):
    """`surgery drift BASE TRAINED`: one model's drift from its base."""
    from surgery.api import warn_if_swapped
    from surgery.diagnostics.drift import drift as run
    from surgery.diagnostics.drift import format_drift, plot_drift, write_drift_csv
    from surgery.diagnostics.plots import check_plot_path
    from surgery.hub.resolve import open_inputs

    if plot:
        check_plot_path(plot)
    base_ckpt, trained_ckpt = open_inputs(
        [base, trained], ranges=not download, companions=[False, False]
    )
    warn_if_swapped(base_ckpt, trained_ckpt)
    report = run(base_ckpt, trained_ckpt, stack=stack, quiet=quiet)
    click.echo(format_drift(report))
    if csv_path:
        write_drift_csv(report, Path(csv_path))
    if plot:
        plot_drift(report, Path(plot), f"Drift of {Path(trained).name} from {Path(base).name}")


def _similarity(
    base, experts, *, stack, csv_path, plot, quiet, download, json_path, pair_plot, pair, labels
):
    """`surgery drift BASE EXPERT EXPERT...`: how alike the experts' task vectors are."""
    from surgery.api import warn_if_swapped
    from surgery.diagnostics import similarity_report as out
    from surgery.diagnostics.plots import check_plot_path
    from surgery.diagnostics.similarity import similarity
    from surgery.hub.resolve import open_inputs

    for path in (plot, pair_plot):
        if path:
            check_plot_path(path)
    names = out.expert_labels(experts, labels)
    chosen = out.pick_pair(names, pair)
    base_ckpt, *expert_ckpts = open_inputs(
        [base, *experts], ranges=not download, companions=[False] * (len(experts) + 1)
    )
    if pair_plot and not expert_ckpts[0].stacks:
        raise SurgeryError("--pair-plot plots layers, and the experts have no layer stack")
    for expert in expert_ckpts:
        warn_if_swapped(base_ckpt, expert)
    report = similarity(base_ckpt, expert_ckpts, names, stack=stack, quiet=quiet)
    click.echo(out.format_similarity(report))
    if csv_path:
        out.write_similarity_csv(report, Path(csv_path))
    if json_path:
        out.write_similarity_json(report, Path(json_path))
    of = f"of {len(names)} experts of {Path(base).name}"
    if plot:
        out.plot_regions(report, Path(plot), f"Task-vector cosine {of}")
    if pair_plot:
        a, b = names[chosen[0]], names[chosen[1]]
        out.plot_pair(report, chosen, Path(pair_plot), f"Task-vector cosine of {a} and {b}")
