"""The commands that read a checkpoint and write none: inspect, verify, push."""

from __future__ import annotations

import json
import sys

import click

from surgery.options import download_option, quiet_option


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@download_option
@click.argument("checkpoint", type=click.Path())
@click.argument("other", type=click.Path(), required=False)
def inspect(as_json, download, checkpoint, other):
    """Summarize CHECKPOINT from its headers: stacks, layers, dtypes, parameters, shards, recipe.

    With OTHER, show how the two checkpoints' tensors match, tensor by tensor (a multimodal base
    and a text-only fine-tune name one text model's tensors differently), and what revert and
    soup make of it.

    \b
    Examples:
      surgery inspect path/to/model
      surgery inspect --json model.safetensors
      surgery inspect ckpt/dense google/gemma-3-4b-pt
    """
    from surgery.checks import inspection
    from surgery.hub.resolve import open_input, open_inputs

    if other is not None:
        pair = open_inputs([checkpoint, other], ranges=not download, companions=[False, False])
        info = inspection.compare(*pair)
        click.echo(json.dumps(info, indent=2) if as_json else inspection.format_comparison(info))
        return
    info = inspection.describe(open_input(checkpoint, ranges=not download, companions=False))
    click.echo(json.dumps(info, indent=2) if as_json else inspection.format_description(info))


@click.command()
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
    from surgery.checks.verify import verify as run
    from surgery.hub.resolve import resolve

    report = run(resolve(checkpoint)[0], values=values, quiet=quiet)
    for warning in report.warnings:
        click.echo(f"warning: {warning}", err=True)
    for problem in report.problems:
        click.echo(f"defect: {problem}")
    status = "ok" if report.ok else f"{len(report.problems)} defect(s)"
    click.echo(f"{checkpoint}: {report.shards} shard(s), {report.tensors} tensors: {status}")
    sys.exit(0 if report.ok else 1)


@click.command()
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
    from surgery.hub.push import push as run

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


COMMANDS = [inspect, verify, push]
