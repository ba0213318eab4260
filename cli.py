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

import os  # noqa: E402
from pathlib import Path  # noqa: E402

import click  # noqa: E402

from eval.options import check_halves, eval_options, suite_option  # noqa: E402
from surgery import __version__  # noqa: E402
from surgery.commands import checkpoints, reading  # noqa: E402
from surgery.commands.drift import drift  # noqa: E402
from surgery.core.cli_paths import OutputFolder  # noqa: E402
from surgery.core.errors import SurgeryError  # noqa: E402
from surgery.options import (  # noqa: E402
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
    to a base, soup experts, interpolate, inspect and verify; measure drift, sweep alphas,
    localize forgetting and search layer profiles; train and evaluate; push results to the Hub.
    `surgery COMMAND --help` shows examples.
    """


def _scorer(tasks, scoring, suite=None, trained=None):
    """The scorer sweep and localize receive (surgery never imports eval): the tasks (or the
    suite's units), parsed and their data read now, before any checkpoint is read, scored with
    the scoring options."""
    if suite:
        if tasks:
            raise click.UsageError("--suite names the tasks; give --suite or -t/--task, not both")
        from eval.study.memory import SuiteScorer

        return SuiteScorer.of(suite, scoring, trained)
    from eval.scorer import TaskScorer

    return TaskScorer.of(tasks, scoring)


@cli.command()
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

    check_halves(suite, scoring)
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
        scorer=_scorer(tasks, scoring, suite, trained) if scoring_on else None,
        save=not no_save,
        in_memory=in_memory,
        extrapolate=extrapolate,
        write=write,
    )
    if scoring_on:
        from surgery.diagnostics.results import format_table, metric_names

        click.echo(format_table(rows, ["alpha", *metric_names(rows)]))
    finish(Path(out), write)


@cli.command()
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

    check_halves(suite, scoring)
    if not tasks and not suite:
        raise click.UsageError("localize needs at least one -t/--task, or --suite")
    if not given("blocks") and any(v is not None for v in (block_width, window, boundaries)):
        blocks = None  # the default --blocks gives way to another way of forming blocks
    parse_block_plan(blocks, block_width, window, stride, boundaries)  # before any data is read
    result = run_localize(
        base,
        trained,
        _scorer(tasks, scoring, suite, trained),
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


from demo.command import demo  # noqa: E402
from eval.command import eval_command  # noqa: E402
from eval.search.command import search_command  # noqa: E402
from eval.study.command import compare  # noqa: E402

for command in [*checkpoints.COMMANDS, *reading.COMMANDS, drift, compare, demo]:
    cli.add_command(command)
cli.add_command(search_command, "search")

cli.add_command(eval_command, "eval")


from eval.options import scoring_options, task_option  # noqa: E402
from surgery.options import options  # noqa: E402
from train.command import EvalHook, build_train_command  # noqa: E402

# train's periodic eval: -t/--task and the scoring options that apply to a model already on its
# device, under --eval-* names (train has its own --batch-size and --seed).
_train_eval_options = options(
    task_option,
    scoring_options(
        "batch_size", "limit", "seed", "max_length", prefix="eval-", dest="eval_scoring"
    ),
)


def _train_scorer(tasks, scoring):
    """`score(model, tokenizer)` for `train --eval-every`, built here because train never
    imports eval: the eval wrapper's tasks, parsed and their data read now (a typo fails before
    training), scored with the --eval-* options on the model as it trains."""
    scorer = _scorer(tasks, scoring)

    def score(model, tokenizer) -> dict[str, float]:
        metrics = scorer(model, tokenizer, progress=False)
        # Scores only: item and token counts do not change during a run.
        return {name: value for name, value in metrics.items() if isinstance(value, float)}

    return score


cli.add_command(build_train_command(EvalHook(_train_eval_options, _train_scorer)), "train")


def main() -> None:
    """Console-script entry point."""
    install_signal_handlers()
    cli()


if __name__ == "__main__":
    main()
