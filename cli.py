"""The `surgery` command line: one click group; each subcommand parses, validates, delegates.

Errors the user can fix (`SurgeryError`) become one line on stderr and exit code 2; `--debug`
(or SURGERY_DEBUG=1) shows the traceback instead.
"""

from __future__ import annotations

import signal
import sys


class Interrupted(SystemExit):
    """SIGINT, SIGTERM or SIGHUP, raised where the main thread is, so every `finally` and
    `except BaseException` (the staging folder's cleanup) runs; exits with code 2."""

    def __init__(self, signum: int) -> None:
        super().__init__(2)
        self.signame = signal.Signals(signum).name


_interrupted = False


def _on_signal(signum: int, frame: object) -> None:
    # The first signal unwinds the run; later ones are ignored so that cleanup finishes.
    global _interrupted
    if not _interrupted:
        _interrupted = True
        stop = Interrupted(signum)
        # Said here, not where it is caught: a signal during the imports is never caught.
        sys.stderr.write(f"\nerror: interrupted by {stop.signame}; no partial output is left\n")
        raise stop


def install_signal_handlers() -> None:
    """Make SIGINT, SIGTERM and SIGHUP raise `Interrupted` (the `surgery` command only: a
    program importing this module keeps its own handlers)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _on_signal)


# Installed before the heavy imports below, so an early Ctrl-C exits quietly (code 2).
if __name__ == "__main__" or sys.argv[0].rsplit("/", 1)[-1] == "surgery":
    install_signal_handlers()

import json  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402

import click  # noqa: E402

from eval.options import eval_options, with_suite_options  # noqa: E402
from surgery import __version__  # noqa: E402
from surgery.core.cli_paths import OutputFile, OutputFolder  # noqa: E402
from surgery.core.errors import SurgeryError  # noqa: E402


def _one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


# The top-level --help lists every command under one of these headings, in this order.
SECTIONS = {
    "Surgery": ["revert", "soup", "interpolate", "merge", "extract-lora", "inspect", "verify"],
    "Diagnostics": ["drift", "sweep", "localize", "search"],
    "Training and eval": ["train", "eval", "compare", "demo"],
    "Hub": ["push"],
}


class SurgeryGroup(click.Group):
    """A click group that turns the project's errors, usage errors, operating-system errors and
    signals into one line on stderr and exit code 2, and lists its commands by section."""

    resolved: str | None = None  # the subcommand being run, for usage errors

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name, command, rest = super().resolve_command(ctx, args)
        self.resolved = name
        return name, command, rest

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except Interrupted:
            raise  # cleanup ran while it unwound; its line is already out
        except (SurgeryError, OSError) as error:
            if ctx.params.get("debug") or os.environ.get("SURGERY_DEBUG"):
                raise
            if isinstance(error, OSError):
                reason = (error.strerror or str(error)).lower()
                where = f"{error.filename}: " if error.filename else ""
                click.echo(f"error: {where}{reason}", err=True)
            else:
                click.echo(f"error: {_one_line(str(error))}", err=True)
            sys.exit(2)

    def main(self, *args, **kwargs):
        """Run the CLI; a usage error is one line naming the command's --help, exit code 2."""
        kwargs["standalone_mode"] = False
        try:
            result = super().main(*args, **kwargs)
        except click.UsageError as error:
            # Option-parsing errors carry no context: name the command resolved last instead.
            where = error.ctx.command_path if error.ctx is not None else None
            where = where or " ".join(filter(None, ["surgery", self.resolved]))
            click.echo(f"error: {error.format_message()} (see `{where} --help`)", err=True)
            sys.exit(2)
        except click.ClickException as error:
            error.show()
            sys.exit(error.exit_code)
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(130)
        sys.exit(result if isinstance(result, int) else 0)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        listed = set()
        for title, names in SECTIONS.items():
            rows = [
                (name, self.commands[name].get_short_help_str(limit=200))
                for name in names
                if name in self.commands
            ]
            listed.update(name for name, _ in rows)
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)
        rest = [(n, c.get_short_help_str(200)) for n, c in self.commands.items() if n not in listed]
        if rest:
            with formatter.section("Other"):
                formatter.write_dl(rest)


@click.group(cls=SurgeryGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.version_option(__version__, prog_name="surgery")
def cli(debug: bool) -> None:
    """Checkpoint surgery for LLMs: undo, blend and localize what training changed.

    Streams safetensors checkpoints (local folders or Hub ids) tensor by tensor: revert layers
    to a base, soup experts, interpolate, inspect and verify; measure drift, sweep alphas and
    localize forgetting; train and evaluate; push results to the Hub. `surgery COMMAND --help`
    shows examples.
    """


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


def _repo_id(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Validate --push-to and the token before any work, not after the checkpoint is written."""
    if value is None:
        return None
    from surgery.hub.push import check_repo_id, check_token

    check_repo_id(value)
    check_token()
    return value


push_option = click.option(
    "--push-to",
    default=None,
    metavar="REPO_ID",
    callback=_repo_id,
    help="Then push OUT to this Hub repository.",
)
download_option = click.option(
    "--download",
    is_flag=True,
    help="Download Hub ids' whole snapshots through the cache instead of reading only the "
    "bytes needed by HTTP range requests.",
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
    from surgery.core.sizes import parse_size

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

        url = push(out, push_to, echo=lambda message: click.echo(message, err=True))
        click.echo(f"pushed {out} to {url}", err=True)


stack_option = click.option(
    "--stack",
    default=None,
    help="Layer stack the spec addresses (default: the text/decoder stack; e.g. vision).",
)


modules_option = click.option(
    "--modules",
    default=None,
    help="Only these modules of the chosen layers: attn, mlp, attn,mlp, or a regex on names "
    "inside a layer (q_proj|v_proj); norms between blocks are in neither group.",
)


extrapolate_option = click.option(
    "--extrapolate",
    is_flag=True,
    help="Allow alphas outside [0, 1] (extrapolate beyond BASE or TRAINED).",
)


# BASE TRAINED OUT, the arguments of revert and interpolate.
base_trained_out = options(
    click.argument("base", type=click.Path()),
    click.argument("trained", type=click.Path()),
    click.argument("out", type=OutputFolder()),
)


@cli.command()
@click.option(
    "--layers", required=True, help="Layers to take from BASE, e.g. 9:28, -6:, 0:9,28:34."
)
@stack_option
@modules_option
@click.option(
    "--attention-only",
    is_flag=True,
    help="The paper's attention_only: only the MLP tensors of LAYERS (names holding mlp, "
    "gate_proj, up_proj, down_proj, fc1 or fc2) come from BASE; attention and norms stay "
    "TRAINED's.",
)
@write_options
@download_option
@base_trained_out
def revert(
    layers,
    stack,
    modules,
    attention_only,
    dtype,
    max_shard_size,
    force,
    push_to,
    quiet,
    download,
    base,
    trained,
    out,
):
    """Take LAYERS from BASE and everything else from TRAINED (byte copies).

    \b
    Examples:
      surgery revert --layers 9:28 base trained out          # middle 19 of 34 layers
      surgery revert --layers -6: base trained out           # the last six layers
      surgery revert --layers 0:4 --stack vision base trained out
      surgery revert --layers 9:28 --modules mlp base trained out  # only their MLPs
      surgery revert --layers 9:28 --attention-only base trained out  # the paper's
    """
    from surgery.api import revert as run

    kwargs = _write_kwargs(dtype, max_shard_size, force, quiet)
    kwargs.update(download=download, modules=modules, attention_only=attention_only)
    _done(run(base, trained, out, layers, stack=stack, **kwargs), quiet, push_to)


@cli.command()
@click.option(
    "--weights", default=None, help="Comma-separated weights, normalized (default: uniform)."
)
@write_options
@download_option
@click.argument("experts", nargs=-1, required=True, type=click.Path())
@click.argument("out", type=OutputFolder())
def soup(weights, dtype, max_shard_size, force, push_to, quiet, download, experts, out):
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
    kwargs["download"] = download
    _done(run(list(experts), out, parse_weights(weights, len(experts)), **kwargs), quiet, push_to)


@cli.command()
@click.option(
    "--alpha", required=True, help="Weight of TRAINED: a number, or per range: 9:28=0.3,*=1.0."
)
@click.option(
    "--layers", default=None, help="Blend only these layers; all other tensors from TRAINED."
)
@stack_option
@modules_option
@extrapolate_option
@write_options
@download_option
@base_trained_out
def interpolate(
    alpha,
    layers,
    stack,
    modules,
    extrapolate,
    dtype,
    max_shard_size,
    force,
    push_to,
    quiet,
    download,
    base,
    trained,
    out,
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
      surgery interpolate --alpha 9:28=0.3,*=1.0 --modules attn base trained out
    """
    from surgery.api import interpolate as run

    kwargs = _write_kwargs(dtype, max_shard_size, force, quiet)
    kwargs["download"] = download
    out = run(
        base,
        trained,
        out,
        alpha,
        layers=layers,
        stack=stack,
        modules=modules,
        extrapolate=extrapolate,
        **kwargs,
    )
    _done(out, quiet, push_to)


@cli.command()
@click.option(
    "--seed", default=0, show_default=True, type=int, help="Seed of DARE/DELLA's random masks."
)
@click.option(
    "--mergekit-arithmetic",
    is_flag=True,
    help="Compute as mergekit does, op by op in the config's dtype (bit-identical to "
    "mergekit-yaml), not in float32 with one rounding; linear, task_arithmetic and the "
    "TIES/DARE/Breadcrumbs/DELLA variants at density 1 only.",
)
@options(shard_option, force_option, push_option, quiet_option)
@download_option
@click.argument("config", type=click.Path())
@click.argument("out", type=OutputFolder())
def merge(seed, mergekit_arithmetic, max_shard_size, force, push_to, quiet, download, config, out):
    """Run a mergekit YAML CONFIG on the streaming engine; write the result to OUT.

    Methods: linear, task_arithmetic, ties, dare_ties, dare_linear, breadcrumbs,
    breadcrumbs_ties, della, della_linear, slerp, nuslerp, model_stock, passthrough (slices).
    Any key or method not supported is an error.

    \b
    Examples:
      surgery merge ties.yml out
      surgery merge --seed 1 dare.yml out
      surgery merge --mergekit-arithmetic bf16-ties.yml out  # mergekit's bits
      surgery merge revert-out/mergekit_config.yml replay    # replay any output's config
    """
    from surgery.api import merge as run

    kwargs = _write_kwargs(None, max_shard_size, force, quiet)
    del kwargs["dtype"]
    path = run(
        config,
        out,
        seed=seed,
        download=download,
        mergekit_arithmetic=mergekit_arithmetic,
        **kwargs,
    )
    _done(path, quiet, push_to)


@cli.command("extract-lora")
@click.option(
    "--rank", "--max-rank", default=128, show_default=True, type=int, help="Largest LoRA rank."
)
@click.option(
    "--sv-epsilon",
    default=0.0,
    show_default=True,
    type=float,
    help="Also drop singular values at or below this (absolute, as mergekit's).",
)
@click.option("--layers", default=None, help="Only these layers (e.g. 0:9,28:34); no embeddings.")
@stack_option
@modules_option
@click.option("-i", "--include-regex", "include", multiple=True, help="Only modules matching.")
@click.option("-e", "--exclude-regex", "exclude", multiple=True, help="No modules matching.")
@click.option(
    "--embed-lora/--no-embed-lora",
    default=False,
    help="Factor the embeddings too (default: save them and the head whole).",
)
@click.option(
    "--save-module", "save_modules", multiple=True, help="Save this module whole (repeatable)."
)
@click.option("--skip-undecomposable", is_flag=True, help="Leave out norms (no 2-D weight).")
@click.option(
    "--distribute-scale/--no-distribute-scale",
    default=True,
    help="A = sqrt(S) V^T, B = U sqrt(S) (default), or A = S V^T, B = U.",
)
@click.option(
    "--svd",
    type=click.Choice(["full", "randomized"]),
    default="full",
    show_default=True,
    help="torch.linalg.svd, or torch.svd_lowrank (seeded) for large matrices.",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of --svd randomized.")
@options(force_option, push_option, quiet_option)
@download_option
@base_trained_out
def extract_lora(
    rank,
    sv_epsilon,
    layers,
    stack,
    modules,
    include,
    exclude,
    embed_lora,
    save_modules,
    skip_undecomposable,
    distribute_scale,
    svd,
    seed,
    force,
    push_to,
    quiet,
    download,
    base,
    trained,
    out,
):
    """Write a PEFT LoRA adapter of TRAINED's change from BASE, by SVD of each weight's change.

    Loaded onto BASE (PeftModel.from_pretrained), it gives TRAINED's weights up to the singular
    values discarded beyond --rank. Embeddings, head and norms are saved whole by default.

    \b
    Examples:
      surgery extract-lora --rank 16 base trained adapter
      surgery extract-lora --rank 64 --layers -6: --modules mlp base trained adapter
      surgery extract-lora --rank 32 --svd randomized -e lm_head base trained adapter
    """
    from surgery.api import extract_lora as run
    from surgery.engine.lowrank import Solver
    from surgery.engine.ops.extract_lora import LoraOptions

    options = LoraOptions(
        rank=rank,
        sv_epsilon=sv_epsilon,
        embed_lora=embed_lora,
        save_modules=tuple(save_modules),
        include=tuple(include),
        exclude=tuple(exclude),
        skip_undecomposable=skip_undecomposable,
        solver=Solver(svd, seed, distribute_scale),
    )
    written = run(
        base,
        trained,
        out,
        options,
        layers=layers,
        stack=stack,
        modules=modules,
        download=download,
        force=force,
        quiet=quiet,
    )
    _done(written, quiet, push_to)


@cli.command()
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


def _scorer(tasks, eval_options, suite=None, trained=None):
    """The scorer sweep and localize receive (surgery never imports eval): the tasks (or the
    suite's units), parsed and their data read now, before any checkpoint is read, scored with
    the eval options."""
    if suite and suite["suite"]:
        if tasks:
            raise click.UsageError("--suite names the tasks; give --suite or -t/--task, not both")
        from eval.study.memory import SuiteScorer

        return SuiteScorer.of(
            suite["suite"], eval_options, trained, suite["half"], suite["split_seed"]
        )
    from eval.scorer import TaskScorer

    return TaskScorer.of(tasks, eval_options)


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
@modules_option
@extrapolate_option
@click.option("--no-save", is_flag=True, help="Do not keep a checkpoint per alpha (needs -t).")
@click.option(
    "--in-memory/--write-and-reload",
    default=None,
    help="How to score points [default: in memory when the model fits].",
)
@eval_options
@with_suite_options
@options(shard_option, force_option, quiet_option)
@click.argument("base", type=click.Path())
@click.argument("trained", type=click.Path())
@click.argument("out_dir", type=OutputFolder())
def sweep(
    grid,
    layers,
    stack,
    modules,
    extrapolate,
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
    suite,
):
    """Interpolate BASE -> TRAINED at every alpha; save alpha-X.XX checkpoints and/or score them.

    With -t/--task (or --suite), writes sweep.csv, sweep.json and sweep.png (each metric against
    alpha) in OUT_DIR; alpha 0 is BASE and alpha 1 is TRAINED, bit for bit.

    \b
    Examples:
      surgery sweep --alpha 0:1:0.25 base trained sweep/
      surgery sweep --alpha 0:1:0.1 --layers 9:28 base trained sweep/ -t copain --no-save
      surgery sweep --alpha 0,0.5,1 base trained sweep/ -t ppl:madlad/ -t belebele:b.jsonl
      surgery sweep --alpha 0:1:0.25 base trained sweep/ --suite study.yml --no-save
    """
    from surgery.core.sizes import parse_size
    from surgery.diagnostics.sweep import parse_alpha_grid, run_sweep

    scoring = bool(tasks) or bool(suite["suite"])
    rows = run_sweep(
        base,
        trained,
        out_dir,
        parse_alpha_grid(grid),
        layers=layers,
        stack=stack,
        modules=modules,
        scorer=_scorer(tasks, eval_options, suite, trained) if scoring else None,
        save=not no_save,
        in_memory=in_memory,
        extrapolate=extrapolate,
        max_shard_size=parse_size(max_shard_size),
        force=force,
        quiet=quiet,
    )
    if scoring:
        from surgery.diagnostics.results import format_table, metric_names

        click.echo(format_table(rows, ["alpha", *metric_names(rows)]))
    _done(Path(out_dir), quiet, None)


@cli.command()
@stack_option
@click.option("--csv", "csv_path", type=OutputFile(), help="Per-tensor rows as CSV.")
@click.option(
    "--plot", type=OutputFile(), help="Bar chart of drift over layers (.png, .pdf or .svg)."
)
@click.option("--force", is_flag=True, help="Replace existing --csv/--plot files (never an input).")
@quiet_option
@download_option
@click.argument("base", type=click.Path())
@click.argument("trained", type=click.Path())
def drift(stack, csv_path, plot, force, quiet, download, base, trained):
    """How far TRAINED moved from BASE: relative L2 and cosine per layer and module kind.

    Streamed: the models are never loaded whole.

    \b
    Examples:
      surgery drift base trained
      surgery drift base trained --csv drift.csv --plot drift.png
    """
    from surgery.api import warn_if_swapped
    from surgery.diagnostics.drift import drift as run
    from surgery.diagnostics.drift import format_drift, plot_drift, write_drift_csv
    from surgery.diagnostics.plots import check_plot_path
    from surgery.engine.output_paths import check_output_files
    from surgery.hub.resolve import open_inputs

    # Before any input is read: a bad output path costs nothing and writes nothing.
    check_output_files([csv_path, plot], [base, trained], force)
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
@modules_option
@click.option(
    "--out-dir",
    default="localize",
    show_default=True,
    type=OutputFolder(),
    help="Where localize.csv/.json/.png go.",
)
@click.option("--force", is_flag=True, help="Replace --out-dir if it exists (never an input).")
@eval_options
@with_suite_options
@quiet_option
@click.argument("base", type=click.Path())
@click.argument("trained", type=click.Path())
def localize(
    blocks,
    block_size,
    alphas,
    stack,
    modules,
    out_dir,
    force,
    tasks,
    eval_options,
    suite,
    quiet,
    base,
    trained,
):
    """Revert one block of layers at a time to BASE and score: which block carries each metric?

    Recovery = (score - TRAINED's) / (BASE's - TRAINED's): 1 means reverting the block alone gives
    BASE's score. Prints a table and the best block per metric; writes a heatmap.

    \b
    Examples:
      surgery localize base trained --blocks 0:9,9:28,28:34 -t belebele:b.jsonl -t copain
      surgery localize base trained --block-size 4 --alphas 0,0.5 -t ppl:madlad/
      surgery localize base trained --blocks 0:9,9:28,28:34 --suite study.yml
    """
    from surgery.diagnostics.localize import format_localization, run_localize
    from surgery.diagnostics.sweep import parse_alpha_grid

    if not tasks and not suite["suite"]:
        raise click.UsageError("localize needs at least one -t/--task, or --suite")
    result = run_localize(
        base,
        trained,
        _scorer(tasks, eval_options, suite, trained),
        blocks=blocks,
        block_size=block_size,
        alphas=parse_alpha_grid(alphas),
        stack=stack,
        modules=modules,
        quiet=quiet,
        out_dir=out_dir,
        force=force,
    )
    click.echo(format_localization(result))
    _done(Path(out_dir), quiet, None)


@cli.command()
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
    from eval.study.compare import compare as run_compare
    from eval.study.compare import default_jobs
    from eval.study.report import write_report
    from surgery.engine.output_dir import staged_output
    from surgery.engine.output_paths import check_output

    check_output(out, [base, *dirs], force)
    comparison = run_compare(
        base,
        list(dirs),
        resamples=resamples,
        seed=seed,
        jobs=jobs or default_jobs(),
        progress=not quiet,
    )
    for warning in comparison.warnings:
        click.echo(f"warning: {warning}", err=True)
    with staged_output(out) as staging:
        notes = write_report(comparison, staging, bold)
    for note in notes if not quiet else ():
        click.echo(note, err=True)
    _done(out, quiet, None)


@cli.command()
@click.argument("out_dir", default="surgery-demo", type=OutputFolder())
@click.option("--quick", is_flag=True, help="A smaller run: about 7 minutes on 2 CPU cores.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--seeds",
    default=None,
    type=click.IntRange(min=2),
    help="Run the demo N times, seeds SEED..SEED+N-1 (into OUT_DIR/seed-S), and write "
    "OUT_DIR/spread.md: each change's median and range over the runs, bold where it held in "
    "every one.",
)
@click.option("--device", default=None, help="cpu or cuda [default: cuda when available].")
def demo(out_dir, quick, seed, seeds, device):
    """The paper's pipeline in miniature, offline: train, forget, repair, measure.

    Generates a synthetic world (a general language, five language families with a held-out
    relative each), pretrains a tiny base, runs Dense CPT, family experts, freezing, L2-SP, EMA,
    Dense-/Expert-Reverted and Expert Soup, scores them all and writes OUT_DIR/report.md with a
    table of deltas from the base, plots, and one expert's drift and sweep. A second run reuses
    finished stages.

    \b
    Examples:
      surgery demo --quick
      surgery demo --quick --seeds 3 runs/spread   # what holds over three runs
      surgery demo runs/demo --device cuda
    """
    if seeds is not None:
        from eval.demo.spread import run_seeds

        run_seeds(out_dir, quick=quick, seeds=list(range(seed, seed + seeds)), device=device)
        return
    from eval.demo.pipeline import run_demo

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

from eval.search.command import search_command  # noqa: E402

cli.add_command(search_command, "search")


from eval.options import task_option  # noqa: E402
from train.command import EvalHook, build_train_command  # noqa: E402


def _train_scorer(tasks):
    """`score(model, tokenizer)` for `train --eval-every`, built here because train never
    imports eval: the eval wrapper's tasks, parsed and their data read now (a typo fails before
    training), scored with `surgery eval`'s defaults on the model as it trains."""
    scorer = _scorer(tasks, None)

    def score(model, tokenizer) -> dict[str, float]:
        metrics = scorer(model, tokenizer, progress=False)
        # Scores only: item and token counts do not change during a run.
        return {name: value for name, value in metrics.items() if isinstance(value, float)}

    return score


cli.add_command(build_train_command(EvalHook(task_option, _train_scorer)), "train")


def main() -> None:
    """Console-script entry point."""
    install_signal_handlers()
    cli()


if __name__ == "__main__":
    main()
