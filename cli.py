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

from eval.options import eval_options
from surgery import __version__
from surgery.core.errors import SurgeryError


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


dtype_option = click.option(
    "--dtype", default=None, help="Output float dtype (bf16, fp16, fp32); default: the inputs'."
)
shard_option = click.option(
    "--max-shard-size",
    default="5GB",
    show_default=True,
    help="Largest output shard (e.g. 5GB, 500MB).",
)
force_option = click.option(
    "--force", is_flag=True, help="Replace OUT if it exists (never an input)."
)
push_option = click.option(
    "--push-to", default=None, metavar="REPO_ID", help="Then push OUT to this Hub repository."
)


def options(*decorators):
    """Apply several click options as one decorator, in the order given."""

    def apply(command):
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return apply


# Every command that writes one checkpoint.
write_options = options(dtype_option, shard_option, force_option, push_option, quiet_option)


def _write_kwargs(dtype: str | None, max_shard_size: str, force: bool, quiet: bool) -> dict:
    from surgery.core.dtypes import parse_dtype
    from surgery.engine.writer import parse_size

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
        from surgery.hub.push import push

        url = push(out, push_to)
        click.echo(f"pushed {out} to {url}", err=True)


stack_option = click.option(
    "--stack",
    default=None,
    help="Layer stack the spec addresses (default: the text/decoder stack; e.g. vision).",
)


# BASE TRAINED OUT, the arguments of revert and interpolate.
base_trained_out = options(
    click.argument("base", type=click.Path()),
    click.argument("trained", type=click.Path()),
    click.argument("out", type=click.Path()),
)


@cli.command()
@click.option(
    "--layers", required=True, help="Layers to take from BASE, e.g. 9:28, -6:, 0:9,28:34."
)
@stack_option
@write_options
@base_trained_out
def revert(layers, stack, dtype, max_shard_size, force, push_to, quiet, base, trained, out):
    """Take LAYERS from BASE and everything else from TRAINED (byte copies).

    \b
    Examples:
      surgery revert --layers 9:28 base trained out          # middle 19 of 34 layers
      surgery revert --layers -6: base trained out           # the last six layers
      surgery revert --layers 0:4 --stack vision base trained out
    """
    from surgery.api import revert as run

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
    from surgery.api import soup as run
    from surgery.engine.ops.soup import parse_weights

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
@base_trained_out
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
    from surgery.api import interpolate as run

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
    from surgery.checks.inspection import describe, format_description
    from surgery.hub.resolve import open_input

    info = describe(open_input(checkpoint))
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


@cli.command()
@click.option(
    "--alpha",
    "grid",
    default="0:1:0.1",
    show_default=True,
    help="start:stop:step (stop included on the grid) or a list 0,0.5,1.",
)
@click.option("--layers", default=None, help="Blend only these layers; others from TRAINED.")
@stack_option
@click.option("--no-save", is_flag=True, help="Do not keep a checkpoint per alpha (needs -t).")
@click.option(
    "--in-memory/--write-and-reload",
    default=None,
    help="How to score points [default: in memory when the model fits].",
)
@eval_options
@options(shard_option, force_option, quiet_option)
@click.argument("base", type=click.Path())
@click.argument("trained", type=click.Path())
@click.argument("out_dir", type=click.Path())
def sweep(
    grid,
    layers,
    stack,
    no_save,
    in_memory,
    tasks,
    max_shard_size,
    force,
    quiet,
    base,
    trained,
    out_dir,
    eval_options,
):
    """Interpolate BASE -> TRAINED at every alpha; save alpha-X.XX checkpoints and/or score them.

    With -t/--task, writes sweep.csv, sweep.json and sweep.png (each metric against alpha) in
    OUT_DIR; alpha 0 is BASE and alpha 1 is TRAINED, bit for bit.

    \b
    Examples:
      surgery sweep --alpha 0:1:0.25 base trained sweep/
      surgery sweep --alpha 0:1:0.1 --layers 9:28 base trained sweep/ -t copain --no-save
      surgery sweep --alpha 0,0.5,1 base trained sweep/ -t ppl:madlad/ -t belebele:b.jsonl
    """
    from surgery.diagnostics.sweep import parse_alpha_grid, run_sweep
    from surgery.engine.writer import parse_size

    rows = run_sweep(
        base,
        trained,
        out_dir,
        parse_alpha_grid(grid),
        layers=layers,
        stack=stack,
        tasks=list(tasks),
        save=not no_save,
        in_memory=in_memory,
        eval_options=eval_options,
        max_shard_size=parse_size(max_shard_size),
        force=force,
        quiet=quiet,
    )
    if tasks:
        from surgery.diagnostics.sweep import metric_names

        metrics = metric_names(rows)
        click.echo("alpha  " + "  ".join(metrics))
        for row in rows:
            click.echo(f"{row['alpha']:<5g}  " + "  ".join(f"{row[m]:.4g}" for m in metrics))
    _done(Path(out_dir), quiet, None)


@cli.command()
@stack_option
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), help="Per-tensor rows as CSV.")
@click.option("--plot", type=click.Path(dir_okay=False), help="PNG bar chart of drift over layers.")
@quiet_option
@click.argument("base", type=click.Path())
@click.argument("trained", type=click.Path())
def drift(stack, csv_path, plot, quiet, base, trained):
    """How far TRAINED moved from BASE: relative L2 and cosine per layer and module kind.

    Streamed: the models are never loaded whole.

    \b
    Examples:
      surgery drift base trained
      surgery drift base trained --csv drift.csv --plot drift.png
    """
    import csv

    from surgery.diagnostics.drift import drift as run
    from surgery.diagnostics.drift import drift_rows, format_drift
    from surgery.hub.resolve import open_input

    report = run(open_input(base), open_input(trained), stack=stack, quiet=quiet)
    click.echo(format_drift(report))
    if csv_path:
        rows = drift_rows(report)
        with open(csv_path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    if plot:
        from surgery.diagnostics.plots import plot_drift_by_layer

        values = {key: sums.relative_l2 for key, sums in report.layer_kinds.items()}
        plot_drift_by_layer(
            values, Path(plot), f"Drift of {Path(trained).name} from {Path(base).name}"
        )


@cli.command()
@click.option(
    "--blocks", default=None, help="Comma-separated blocks, each a slice: 0:9,9:28,28:34."
)
@click.option("--block-size", type=int, default=None, help="Or consecutive blocks of this width.")
@click.option(
    "--alphas",
    default="0",
    show_default=True,
    help="Blend of each block toward TRAINED while scoring (0 = full revert), e.g. 0,0.5.",
)
@stack_option
@click.option(
    "--out-dir",
    default="localize",
    show_default=True,
    type=click.Path(),
    help="Where localize.csv/.json/.png go.",
)
@force_option
@eval_options
@quiet_option
@click.argument("base", type=click.Path())
@click.argument("trained", type=click.Path())
def localize(
    blocks, block_size, alphas, stack, out_dir, force, tasks, eval_options, quiet, base, trained
):
    """Revert one block of layers at a time to BASE and score: which block carries each metric?

    Recovery = (score - TRAINED's) / (BASE's - TRAINED's): 1 means reverting the block alone gives
    BASE's score. Prints a table and the best block per metric; writes a heatmap.

    \b
    Examples:
      surgery localize base trained --blocks 0:9,9:28,28:34 -t belebele:b.jsonl -t copain
      surgery localize base trained --block-size 4 --alphas 0,0.5 -t ppl:madlad/
    """
    from surgery.diagnostics.localize import format_localization, run_localize
    from surgery.diagnostics.sweep import parse_alpha_grid

    if not tasks:
        raise click.UsageError("localize needs at least one -t/--task")
    result = run_localize(
        base,
        trained,
        list(tasks),
        blocks=blocks,
        block_size=block_size,
        alphas=parse_alpha_grid(alphas),
        stack=stack,
        quiet=quiet,
        eval_options=eval_options,
        out_dir=out_dir,
        force=force,
    )
    click.echo(format_localization(result))
    _done(Path(out_dir), quiet, None)


@cli.command()
@click.argument("out_dir", default="surgery-demo", type=click.Path())
@click.option("--quick", is_flag=True, help="A smaller run: about two minutes on 2 CPU cores.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--device", default=None, help="cpu or cuda [default: cuda when available].")
def demo(out_dir, quick, seed, device):
    """The paper's pipeline in miniature, offline: train, forget, repair, measure.

    Generates a synthetic world (a general language, five language families with a held-out
    relative each), pretrains a tiny base, runs Dense CPT, family experts, freezing, L2-SP, EMA,
    Dense-/Expert-Reverted and Expert Soup, scores them all and writes OUT_DIR/report.md with a
    table of deltas from the base, plots, and one expert's drift and sweep. A second run reuses
    finished stages.

    \b
    Examples:
      surgery demo --quick
      surgery demo runs/demo --device cuda
    """
    from surgery.demo.pipeline import run_demo

    run_demo(out_dir, quick=quick, seed=seed, device=device)


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


from eval.command import eval_command  # noqa: E402

cli.add_command(eval_command, "eval")


from train.command import train_command  # noqa: E402

cli.add_command(train_command, "train")


def main() -> None:
    """Console-script entry point."""
    cli()


if __name__ == "__main__":
    main()
