"""The `surgery` command line: one click group; each subcommand parses, validates, delegates.

Errors the user can fix (`SurgeryError`) become one line on stderr and exit code 2; `--debug`
(or SURGERY_DEBUG=1) shows the traceback instead.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from surgery import __version__
from surgery.errors import SurgeryError


class SurgeryGroup(click.Group):
    """A click group that turns the project's errors into one line and exit code 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except SurgeryError as error:
            if ctx.params.get("debug") or os.environ.get("SURGERY_DEBUG"):
                raise
            click.echo(f"error: {error}", err=True)
            sys.exit(2)


@click.group(cls=SurgeryGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.version_option(__version__, prog_name="surgery")
def cli(debug: bool) -> None:
    """Checkpoint surgery for LLMs: revert layers, soup experts, interpolate, inspect, verify."""


quiet_option = click.option("-q", "--quiet", is_flag=True, help="No progress bar.")


def write_options(command):
    """Options shared by every command that writes a checkpoint."""
    options = [
        click.option(
            "--dtype",
            default=None,
            help="Output float dtype (bf16, fp16, fp32); default: the inputs'.",
        ),
        click.option(
            "--max-shard-size",
            default="5GB",
            show_default=True,
            help="Largest output shard (e.g. 5GB, 500MB).",
        ),
        click.option("--force", is_flag=True, help="Replace OUT if it exists (never an input)."),
        click.option(
            "--push-to",
            default=None,
            metavar="REPO_ID",
            help="Then push OUT to this Hub repository.",
        ),
        quiet_option,
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _write_kwargs(dtype: str | None, max_shard_size: str, force: bool, quiet: bool) -> dict:
    from surgery.dtypes import parse_dtype
    from surgery.writer import parse_size

    return {
        "dtype": parse_dtype(dtype) if dtype else None,
        "max_shard_size": parse_size(max_shard_size),
        "force": force,
        "quiet": quiet,
    }


def _done(out: Path, quiet: bool, push_to: str | None) -> None:
    if not quiet:
        click.echo(f"wrote {out}", err=True)
    if push_to:
        from surgery.push import push

        url = push(out, push_to)
        click.echo(f"pushed {out} to {url}", err=True)


stack_option = click.option(
    "--stack",
    default=None,
    help="Layer stack the spec addresses (default: the text/decoder stack; e.g. vision).",
)


@cli.command()
@click.option(
    "--layers", required=True, help="Layers to take from BASE, e.g. 9:28, -6:, 0:9,28:34."
)
@stack_option
@write_options
@click.argument("base", type=click.Path())
@click.argument("trained", type=click.Path())
@click.argument("out", type=click.Path())
def revert(layers, stack, dtype, max_shard_size, force, push_to, quiet, base, trained, out):
    """Take LAYERS from BASE and everything else from TRAINED (byte copies).

    \b
    Examples:
      surgery revert --layers 9:28 base trained out          # middle 19 of 34 layers
      surgery revert --layers -6: base trained out           # the last six layers
      surgery revert --layers 0:4 --stack vision base trained out
    """
    from surgery.ops.revert import revert as run

    kwargs = _write_kwargs(dtype, max_shard_size, force, quiet)
    _done(run(base, trained, out, layers, stack=stack, **kwargs), quiet, push_to)


@cli.command()
@click.option(
    "--weights", default=None, help="Comma-separated weights, normalized (default: uniform)."
)
@write_options
@click.argument("experts", nargs=-1, required=True, type=click.Path())
@click.argument("out", type=click.Path())
def soup(weights, dtype, max_shard_size, force, push_to, quiet, experts, out):
    """Average EXPERTS (two or more) into OUT: sum(w_i * expert_i) / sum(w_i).

    Float tensors accumulate in float32 (float64 for 32-bit inputs) and are rounded once;
    non-float tensors must be identical in every expert and are copied.

    \b
    Examples:
      surgery soup experts/* out
      surgery soup slavic germanic indic out --weights 2,1,1
    """
    from surgery.ops.soup import parse_weights
    from surgery.ops.soup import soup as run

    kwargs = _write_kwargs(dtype, max_shard_size, force, quiet)
    _done(run(list(experts), out, parse_weights(weights, len(experts)), **kwargs), quiet, push_to)


@cli.command()
@click.option(
    "--alpha", required=True, help="Weight of TRAINED: a number, or per range: 9:28=0.3,*=1.0."
)
@click.option(
    "--layers", default=None, help="Blend only these layers; all other tensors from TRAINED."
)
@stack_option
@write_options
@click.argument("base", type=click.Path())
@click.argument("trained", type=click.Path())
@click.argument("out", type=click.Path())
def interpolate(
    alpha, layers, stack, dtype, max_shard_size, force, push_to, quiet, base, trained, out
):
    """Write (1 - alpha) * BASE + alpha * TRAINED.

    alpha 0 gives BASE and alpha 1 gives TRAINED, bit for bit. With per-range alphas, '*' covers
    every other layer and the tensors outside the layer stack; what no range covers comes from
    TRAINED.

    \b
    Examples:
      surgery interpolate --alpha 0.5 base trained out
      surgery interpolate --alpha 0.3 --layers 9:28 base trained out
      surgery interpolate --alpha 9:28=0.3,*=1.0 base trained out
    """
    from surgery.ops.interpolate import interpolate as run

    kwargs = _write_kwargs(dtype, max_shard_size, force, quiet)
    _done(run(base, trained, out, alpha, layers=layers, stack=stack, **kwargs), quiet, push_to)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.argument("checkpoint", type=click.Path())
def inspect(as_json, checkpoint):
    """Summarize CHECKPOINT from its headers: stacks, layers, dtypes, parameters, shards, recipe.

    \b
    Examples:
      surgery inspect path/to/model
      surgery inspect --json model.safetensors
    """
    from surgery.inspection import describe, format_description
    from surgery.reader import open_checkpoint

    info = describe(open_checkpoint(checkpoint))
    click.echo(json.dumps(info, indent=2) if as_json else format_description(info))


@cli.command()
@click.option(
    "--values", is_flag=True, help="Also read every float tensor and flag NaN/inf values."
)
@quiet_option
@click.argument("checkpoint", type=click.Path())
def verify(values, quiet, checkpoint):
    """Check every shard header and the index of CHECKPOINT; exit 1 on any defect.

    \b
    Examples:
      surgery verify path/to/model
      surgery verify --values merged
    """
    from surgery.verify import verify as run

    report = run(checkpoint, values=values, quiet=quiet)
    for warning in report.warnings:
        click.echo(f"warning: {warning}", err=True)
    for problem in report.problems:
        click.echo(f"defect: {problem}")
    status = "ok" if report.ok else f"{len(report.problems)} defect(s)"
    click.echo(f"{checkpoint}: {report.shards} shard(s), {report.tensors} tensors: {status}")
    sys.exit(0 if report.ok else 1)


@cli.command()
@click.option("--private", is_flag=True, help="Create the repository as private.")
@click.option("--revision", default=None, help="Branch to commit to (created if missing).")
@click.option("--commit-message", default=None, help="Commit message.")
@click.option("--dry-run", is_flag=True, help="Print the files and the model card; send nothing.")
@click.argument("checkpoint", type=click.Path())
@click.argument("repo_id")
def push(private, revision, commit_message, dry_run, checkpoint, repo_id):
    """Upload CHECKPOINT to the Hub repository REPO_ID with a generated model card.

    The folder must pass `surgery verify`. Its model card (README.md) is regenerated from
    surgery_recipe.json with REPO_ID as title and eval_results.json when present. Needs a token
    (HF_TOKEN or `hf auth login`).

    \b
    Examples:
      surgery push merged my-org/gemma-3-4b-soup --private
      surgery push reverted my-org/reverted --revision layers-9-28 --dry-run
    """
    from surgery.push import push as run

    url = run(
        checkpoint,
        repo_id,
        private=private,
        revision=revision,
        commit_message=commit_message,
        dry_run=dry_run,
        echo=click.echo,
    )
    if url:
        click.echo(f"pushed {checkpoint} to {url}")






def main() -> None:
    """Console-script entry point."""
    cli()


if __name__ == "__main__":
    main()
