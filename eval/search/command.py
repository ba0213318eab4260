"""`surgery search`: the command line of `eval.search` (click only at import: `surgery --help`
stays fast)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import click

from eval.options import scoring_options, suite_option
from eval.search.settings import SearchOptions
from surgery.options import blocks_option, collapse, out_option, quiet_option

HELP = """Search per-block interpolation profiles between BASE and TRAINED (or per-block soups
of BASE and several experts) on the learning-forgetting frontier of a suite, and report them on
items the search never saw.

\b
Each trial blends the two checkpoints in memory (one strength per block of layers: 0 = BASE,
1 = TRAINED) and scores the search half of the suite's items; optuna proposes the strengths
(a Gaussian process by default, budgets as constraints) and keeps the trials in its storage (DIR's
search.journal, or --storage URL), so a killed search resumes with the same command and
several workers can share one search. The frontier and the baselines (TRAINED, the middle
layers reverted, uniform strengths) are then scored on the report half with paired bootstrap
intervals: DIR gets frontier.json, frontier.png, report.md and report/<point>/ results
folders. Each profile prints as the --alpha string of `surgery interpolate` and as the
`surgery merge` config that writes it.

\b
With several experts, each block also gets each expert's share: BASE weighs 1 - s, the experts
share s. Each expert's family comes from --labels or its folder's name; the baselines add the
uniform Expert Soup, each expert alone, the soup of Expert-Reverted experts and BASE.

\b
Examples:
  surgery search base trained --suite study.yml -o search/ --trials 60
  surgery search base trained --suite study.yml -o search/ --blocks 0:9,9:28,28:34 \\
      --budget "others ppl <= +5%" --time 2h
  surgery search base trained --suite study.yml -o search/ --objectives held_out
  surgery search base expert-slavic expert-germanic expert-indic --suite study.yml -o search/
  surgery search search/ --write 17          # point 17 as a checkpoint: search/point-17
"""


def parse_duration(text: str | None) -> float | None:
    """`90`, `90s`, `30m`, `2h` -> seconds.

    Raises:
        click.BadParameter: another form.
    """
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([smh]?)\s*", text)
    if match is None:
        raise click.BadParameter(f"{text!r}: write seconds or 90s, 30m, 2h")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


def _grid(ctx: click.Context, param: click.Parameter, value: str) -> tuple[float, ...]:
    from surgery.diagnostics.sweep import parse_alpha_grid

    return tuple(parse_alpha_grid(value))


# The search's own options, one `SearchOptions` value (BASE, TRAINED, the suite, the folder and
# the scoring options join it in the command).
search_options = collapse(
    SearchOptions,
    "search",
    blocks_option,
    click.option(
        "--embeddings",
        is_flag=True,
        help="The embeddings, final norm and head as a block of their own (`*`); otherwise "
        "TRAINED's.",
    ),
    click.option(
        "--step", default=0.05, show_default=True, type=float, help="Grid of the strengths."
    ),
    click.option(
        "--measure",
        default=None,
        help="TASK[/METRIC] of learning (held in) and forgetting (others) [default: the suite's "
        "perplexity task].",
    ),
    click.option(
        "--objectives",
        default=None,
        help="More objectives, comma-separated SPLIT [MEASURE]: held_out (transfer), "
        "'held_in chrf'.",
    ),
    click.option(
        "--budget",
        "budgets",
        multiple=True,
        help="A bound, repeatable: 'others ppl <= +5%' (relative to BASE), 'held_in chrf >= +2' "
        "(change), 'held_in ppl <= 30' (value).",
    ),
    click.option(
        "--trials",
        default=50,
        show_default=True,
        type=int,
        help="Trials in all, over every worker.",
    ),
    click.option(
        "--time",
        default=None,
        callback=lambda _ctx, _param, value: parse_duration(value),
        help="Stop after this long: 90s, 30m, 2h.",
    ),
    click.option(
        "--seed",
        default=0,
        show_default=True,
        type=int,
        help="Seeds the sampler's proposals and the bootstrap.",
    ),
    click.option(
        "--baseline-layers",
        default=None,
        help="The reverted baseline's layers [default: the paper's 9:28 of 34, as a share].",
    ),
    click.option(
        "--uniform",
        default="0.25,0.5,0.75",
        show_default=True,
        callback=_grid,
        help="Uniform-strength baselines (sweep's points), a list or start:stop:step.",
    ),
    click.option(
        "--storage", default=None, help="A database URL optuna accepts, for several machines."
    ),
    click.option(
        "--resamples", default=2000, show_default=True, type=int, help="Bootstrap resamples."
    ),
    click.option(
        "--sampler",
        default="tpe",
        show_default=True,
        type=click.Choice(["tpe", "gp", "nsga2", "random"]),
        help="optuna's sampler: multi-objective TPE, a Gaussian process, NSGA-II, or random "
        "(docs/search.md compares them).",
    ),
    click.option(
        "--seed-profiles",
        "seed_profiles",
        multiple=True,
        metavar="FAMILY",
        help="Priors run as first trials, repeatable: lines (LiNeS: linear in depth), reverted "
        "(the paper's middle band), 'localize DIR' (a localize run of these two models), blocks "
        "(each model alone in each block of the soup, then their best per block).",
    ),
    click.option(
        "--labels",
        default=None,
        help="Each expert's family in the suite, comma-separated [default: the family its "
        "folder's name contains].",
    ),
    click.option(
        "--prune/--no-prune",
        default=True,
        show_default=True,
        help="Score a trial on a quarter, then half of the search items first, and stop it "
        "there when it breaks a budget or the frontier dominates it beyond noise.",
    ),
)


@click.command("search", help=HELP, short_help="Search layer profiles on the frontier.")
@click.argument("inputs", nargs=-1, required=True, metavar="BASE EXPERT... | DIR")
@suite_option
@out_option(
    "The search's folder: search.json, frontier.json, frontier.png, report.md, "
    "report/<point>/ and the point-N checkpoints of --write."
)
@search_options
@click.option(
    "--write",
    type=int,
    default=None,
    help="Write point N as a checkpoint: DIR/point-N (DIR: -o/--out, or the one input).",
)
@scoring_options("device", "dtype", "batch_size", "limit", "max_length", "split_seed")
@quiet_option
def search_command(inputs, suite, out, search, write, scoring, quiet) -> None:
    """Run a search, or write a point of a finished one (see HELP)."""
    if len(inputs) == 1:
        if write is None:
            raise click.UsageError("give BASE TRAINED to search, or DIR --write N")
        from eval.search.report import write_point

        click.echo(f"wrote {write_point(Path(inputs[0]), write, quiet=quiet)}", err=True)
        return

    if suite is None or out is None:
        raise click.UsageError("a search needs --suite SUITE and -o/--out DIR")
    from eval.search.report import write_point, write_report
    from eval.search.run import run_search
    from eval.study.scoring import suite_run

    experts = tuple(inputs[1:]) if len(inputs) > 2 else ()
    search = replace(
        search,
        base=inputs[0],
        trained=inputs[1],
        experts=experts,
        suite=Path(suite),
        out=out,
        quiet=quiet,
    )
    searcher = run_search(search, suite_run(scoring.resolved(), progress=False))
    document = write_report(searcher)
    click.echo(format_frontier(document))
    if write is not None:
        click.echo(f"wrote {write_point(out, write, quiet=quiet)}", err=True)
    if not quiet:
        click.echo(f"wrote {out}", err=True)


def format_frontier(document: dict) -> str:
    """One line per point: number, report values of the objectives, profile."""
    names = [o["name"] for o in document["objectives"]]
    lines = [f"{document['trials']} trials; report half (search half in brackets):"]
    flag = "profile" if document.get("experts") else "--alpha"
    for point in document["points"]:
        values = ", ".join(
            f"{name} {point['report'][name]['value']:.4g} ({point['search'][name]:.4g})"
            for name in names
        )
        tag = " frontier" if point["frontier"] else ""
        label = f" [{point['baseline']}]" if point["baseline"] else ""
        lines.append(f"  #{point['point']}{tag}{label}: {values}; {flag} {point['profile']}")
    return "\n".join(lines)
