"""The options shared by commands, each declared once, and the helpers that shape them.

Every command that writes checkpoints (revert, soup, interpolate, merge, extract-lora, sweep)
takes the same write options: `write_options(...)` adds the ones a command has and hands the
command one `WriteOptions` as its `write` argument; `surgery.api` takes that value as it is.
`collapse` does the same for any frozen dataclass (search's options). `-q/--quiet`, `--force`,
`--device`, `--blocks` and `-o/--out` are declared here once (their meanings:
`surgery.option_table`). `renamed` keeps an old spelling for one release, with one note.
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


# -q/--quiet and --force mean the same in every command that has them (`train` declares its own
# from TrainConfig's fields, with the same meaning: see surgery.option_table).
quiet_option = click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
force_option = click.option(
    "--force",
    is_flag=True,
    help="Replace an output that exists (OUT, -o/--out or an output file); never an input.",
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
    return collapse(WriteOptions, "write", *(_OPTIONS[name] for name in names or _OPTIONS))


def collapse(cls: type, dest: str, *decorators: Callable) -> Callable[[Callable], Callable]:
    """Click options (`decorators`) whose parameters are fields of the dataclass `cls`, handed to
    the command as one `cls` value, its argument `dest` (the fields not given keep their
    defaults): options that travel together reach the code as one typed value."""
    probe = options(*decorators)(lambda: None)
    names = [param.name for param in probe.__click_params__]

    def decorate(command: Callable) -> Callable:
        @functools.wraps(command)
        def collapsed(*args: Any, **kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in names}
            return command(*args, **{dest: cls(**values)}, **kwargs)

        return options(*decorators)(collapsed)

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
# Every command that scores or trains: one default rule (surgery.core.devices.resolve_device).
DEVICE_HELP = "cpu, cuda, cuda:1, mps, ... [default: cuda when present, else cpu]."
device_option = click.option("--device", default=None, help=DEVICE_HELP)

# Every command that computes: one thread rule (surgery.core.threads), chosen when it runs.
THREADS_HELP = (
    "CPU threads [default: the cores free when the command starts, shared with other surgery "
    "commands running; or SURGERY_THREADS]."
)


def with_threads(command: click.Command) -> click.Command:
    """Give a command that computes `--threads N`: when it runs (not when its line is only
    parsed), the thread rule chooses and applies this process's threads before its work."""
    callback = command.callback

    @functools.wraps(callback)
    def run(*args: Any, threads: int | None = None, **kwargs: Any) -> Any:
        from surgery.core.threads import use_threads

        use_threads(threads)
        return callback(*args, **kwargs)

    command.callback = run
    command.params.append(
        click.Option(["--threads"], type=click.IntRange(min=1), default=None, help=THREADS_HELP)
    )
    return command


# Localize's and search's blocks of layers, one declaration (N equal blocks, or slices).
blocks_option = click.option(
    "--blocks",
    default="4",
    show_default=True,
    help="N contiguous blocks of the stack as equal as possible (numpy's array_split), or "
    "slices: 0:9,9:28,28:34.",
)


def out_option(help: str, **attrs: Any) -> Callable[[Callable], Callable]:
    """`-o/--out`: the folder of results, reports and figures of a command that writes one (its
    help says what goes there, checkpoints included)."""
    attrs.setdefault("type", OutputFolder(path_type=Path))
    return click.option("-o", "--out", "out", help=help, **attrs)


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


class RenamedOption(click.Option):
    """A hidden old spelling of an option, kept for one release (see `renamed`)."""

    def __init__(self, *args: Any, renamed_from: str, renamed_to: str, **kwargs: Any) -> None:
        super().__init__(*args, hidden=True, **kwargs)
        self.renamed_from, self.renamed_to = renamed_from, renamed_to


class RenamedArgument(click.Argument):
    """A trailing positional kept for one release: optional and left out of the usage line."""

    def __init__(self, *args: Any, renamed_from: str, renamed_to: str, **kwargs: Any) -> None:
        super().__init__(*args, required=False, **kwargs)
        self.renamed_from, self.renamed_to = renamed_from, renamed_to

    def get_usage_pieces(self, ctx: click.Context) -> list[str]:
        return []


def renamed(old: str, new: str, dest: str, **attrs: Any) -> Callable[[Callable], Callable]:
    """Keep the old spelling `old` of the option `new` (whose parameter is `dest`) working for
    one release, hidden from --help: when given, its value goes to `dest` and one note line on
    stderr names the new spelling. `old` is an option (`--out-dir`) or, in capitals, a trailing
    positional (`OUT_DIR`). A multiple option's values join the new option's.

    Raises:
        click.UsageError: (when the command runs) both spellings given.
    """
    key = "renamed_" + old.lstrip("-").replace("-", "_").lower()
    positional = not old.startswith("-")

    def decorate(command: Callable) -> Callable:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            value = kwargs.pop(key)
            if value is None or value == ():
                return command(*args, **kwargs)
            shown = f"the positional {old}" if positional else old
            click.echo(
                f"note: {shown} is now {new}; the old spelling goes in the next release", err=True
            )
            if isinstance(value, tuple):
                kwargs[dest] = (*kwargs[dest], *value)
            elif given(dest):
                raise click.UsageError(f"{shown} is {new}; give it once")
            else:
                kwargs[dest] = value
            return command(*args, **kwargs)

        names = {"renamed_from": old, "renamed_to": new}
        if positional:
            return click.argument(key, cls=RenamedArgument, **names, **attrs)(wrapper)
        return click.option(old, key, cls=RenamedOption, **names, **attrs)(wrapper)

    return decorate


def given(name: str) -> bool:
    """Whether the running command's parameter `name` was given (not its default)."""
    source = click.get_current_context().get_parameter_source(name)
    return source not in (None, click.core.ParameterSource.DEFAULT)
