"""The `surgery` command line: one click group; each subcommand parses, validates, delegates.

Errors the user can fix (`SurgeryError`) become one line on stderr and exit code 2; `--debug`
(or SURGERY_DEBUG=1) shows the traceback instead. Every command is registered from `COMMANDS`
(docs/architecture.md says where each lives).
"""

from __future__ import annotations

# First: for the `surgery` command it installs the signal handlers before the imports below.
from surgery.interrupts import Interrupted, install_signal_handlers

# isort: split
import importlib
import os
import sys
from collections.abc import Callable, Iterator, MutableMapping

import click

from surgery import __version__
from surgery.core.errors import SurgeryError

__all__ = ["COMMANDS", "Interrupted", "cli", "install_signal_handlers", "main"]


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


def _train_command() -> click.Command:
    """`surgery train`, with the eval wrapper's periodic scoring (`-t/--task`)."""
    from diagnose.scorers import TRAIN_EVAL
    from train.command import build_train_command

    return build_train_command(TRAIN_EVAL)


# Every command, once, as "module:attribute" (a command, or a function that builds one).
# A command's module is imported when the command is needed: `surgery revert` does not pay for
# importing eval, train and the demo (about 0.3 s of start-up). `SECTIONS` groups them in --help.
COMMANDS = {
    "revert": "surgery.commands.checkpoints:revert",
    "soup": "surgery.commands.checkpoints:soup",
    "interpolate": "surgery.commands.checkpoints:interpolate",
    "merge": "surgery.commands.checkpoints:merge",
    "extract-lora": "surgery.commands.checkpoints:extract_lora",
    "inspect": "surgery.commands.reading:inspect",
    "verify": "surgery.commands.reading:verify",
    "push": "surgery.commands.reading:push",
    "drift": "surgery.commands.drift:drift",
    "sweep": "diagnose.command:sweep",
    "localize": "diagnose.command:localize",
    "search": "eval.search.command:search_command",
    "train": "cli:_train_command",
    "eval": "eval.command:eval_command",
    "compare": "eval.study.command:compare",
    "demo": "demo.command:demo",
}
# The commands that compute (torch, numpy blends, the engine's writer threads) take `--threads`
# and follow one thread rule; those that only read headers, push or compare numbers do not.
COMPUTING = {
    *("revert", "soup", "interpolate", "merge", "extract-lora", "drift"),
    *("sweep", "localize", "search", "train", "eval", "demo"),
}


def load_command(name: str) -> click.Command:
    """Import and build the command `name` of `COMMANDS` (with `--threads` where it computes)."""
    module, attribute = COMMANDS[name].split(":")
    target = getattr(
        sys.modules[__name__] if module == "cli" else importlib.import_module(module), attribute
    )
    command = target if isinstance(target, click.Command) else target()
    if command.name in COMPUTING:
        from surgery.options import with_threads

        command = with_threads(command)
    return command


class LazyCommands(MutableMapping):
    """The group's command table: names known up front, each command loaded on first use."""

    def __init__(self, loaders: dict[str, Callable[[str], click.Command]]) -> None:
        self._loaders = loaders
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded:
            if name not in self._loaders:
                raise KeyError(name)
            self._loaded[name] = self._loaders[name](name)
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        self._loaded.pop(name, None)
        self._loaders.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self._loaders, *self._loaded]))

    def __len__(self) -> int:
        return len(set(self._loaders) | set(self._loaded))


cli.commands = LazyCommands(dict.fromkeys(COMMANDS, load_command))


def main() -> None:
    """Console-script entry point."""
    install_signal_handlers()
    cli()


if __name__ == "__main__":
    main()
