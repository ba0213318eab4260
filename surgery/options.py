"""How a command writes its checkpoint: one frozen value, and the click options that build it.

Every command that writes checkpoints (revert, soup, interpolate, merge, extract-lora, sweep)
takes the same options, declared once here. `write_options(...)` adds the ones a command has and
hands the command one `WriteOptions` as its `write` argument; `surgery.api` takes that value as it
is, so no command patches keyword arguments by hand.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from surgery.core.cli_paths import OutputFolder
from surgery.core.dtypes import parse_dtype
from surgery.core.sizes import parse_size
from surgery.engine.writer import DEFAULT_MAX_SHARD_SIZE


@dataclass(frozen=True)
class WriteOptions:
    """How an output checkpoint is written, and what happens around the writing.

    Attributes:
        dtype: float dtype of the output (a safetensors name, e.g. BF16); None keeps the inputs'.
        max_shard_size: largest output shard in bytes.
        force: replace OUT if it exists (never an input).
        quiet: no progress bar, no "wrote OUT" line.
        download: read Hub inputs as whole snapshots instead of by HTTP range requests.
        push_to: push OUT to this Hub repository once written.
    """

    dtype: str | None = None
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE
    force: bool = False
    quiet: bool = False
    download: bool = False
    push_to: str | None = None

    def __post_init__(self) -> None:
        # What a user types is accepted here too: "bf16", "500MB".
        if self.dtype is not None:
            object.__setattr__(self, "dtype", parse_dtype(self.dtype))
        if isinstance(self.max_shard_size, str):
            object.__setattr__(self, "max_shard_size", parse_size(self.max_shard_size))

    def with_(self, **changes: Any) -> WriteOptions:
        """A copy with some fields changed (Python callers: ``revert(..., quiet=True)``).

        Raises:
            TypeError: a name that is not a field.
        """
        return replace(self, **changes)


def _repo_id(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Validate --push-to and the token before any work, not after the checkpoint is written."""
    if value is None:
        return None
    from surgery.hub.push import check_repo_id, check_token

    check_repo_id(value)
    check_token()
    return value


quiet_option = click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
force_option = click.option(
    "--force", is_flag=True, help="Replace OUT if it exists (never an input)."
)
download_option = click.option(
    "--download",
    is_flag=True,
    help="Download Hub ids' whole snapshots through the cache instead of reading only the "
    "bytes needed by HTTP range requests.",
)
_OPTIONS = {
    "dtype": click.option(
        "--dtype",
        default=None,
        help="Output float dtype (bf16, fp16, fp32); default: the inputs'.",
    ),
    "max_shard_size": click.option(
        "--max-shard-size",
        default="5GB",
        show_default=True,
        help="Largest output shard (e.g. 5GB, 500MB).",
    ),
    "force": force_option,
    "push_to": click.option(
        "--push-to",
        default=None,
        metavar="REPO_ID",
        callback=_repo_id,
        help="Then push OUT to this Hub repository.",
    ),
    "quiet": quiet_option,
    "download": download_option,
}


def write_options(*names: str) -> Callable[[Callable], Callable]:
    """The click options `names` (fields of `WriteOptions`; all of them when none is named),
    collapsed into one `write: WriteOptions` argument of the command."""
    chosen = names or tuple(_OPTIONS)

    def decorate(command: Callable) -> Callable:
        @functools.wraps(command)
        def collapsed(*args: Any, **kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in chosen}
            return command(*args, write=WriteOptions(**values), **kwargs)

        for name in reversed(chosen):
            collapsed = _OPTIONS[name](collapsed)
        return collapsed

    return decorate


def options(*decorators: Callable) -> Callable[[Callable], Callable]:
    """Apply several click decorators as one, in the order given."""

    def apply(command: Callable) -> Callable:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return apply


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
# BASE TRAINED OUT, the arguments of revert, interpolate and extract-lora.
base_trained_out = options(
    click.argument("base", type=click.Path()),
    click.argument("trained", type=click.Path()),
    click.argument("out", type=OutputFolder()),
)


def wrote(out: Path, quiet: bool) -> None:
    """Say on stderr that a command wrote OUT, unless quiet."""
    if not quiet:
        click.echo(f"wrote {out}", err=True)


def finish(out: Path, write: WriteOptions) -> None:
    """After a command wrote OUT: say so (unless quiet) and push it where --push-to says."""
    wrote(out, write.quiet)
    if write.push_to:
        from surgery.hub.push import push

        url = push(out, write.push_to, echo=lambda message: click.echo(message, err=True))
        click.echo(f"pushed {out} to {url}", err=True)
