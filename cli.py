"""The `surgery` command line: one click group; each subcommand parses, validates, delegates.

Errors the user can fix (`SurgeryError`) become one line on stderr and exit code 2; `--debug`
(or SURGERY_DEBUG=1) shows the traceback instead.
"""

from __future__ import annotations

import os
import sys

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


def main() -> None:
    """Console-script entry point."""
    cli()


if __name__ == "__main__":
    main()
