"""`surgery train`'s options, generated from `TrainConfig`'s field metadata.

One declaration per setting: the dataclass field holds its type, default and help (see
`train.fields.cli`), in `TrainConfig` or in a strategy's option group, and this module turns
each field into a click option, so the command and the Python API cannot drift apart (as
mergekit builds its options from its pydantic model).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import click

from train.config import TrainConfig
from train.fields import Option, flag_of, options_of

# Python types of TrainConfig fields -> click parameter types.
_CLICK_TYPES = {int: click.INT, float: click.FLOAT, str: click.STRING}


def _base_type(hint: Any) -> Any:
    """`int | None` -> int; `Sequence[str | DataSource]` -> str; `bool` -> bool."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _base_type(args[0])
    if typing.get_origin(hint) in (Sequence, list, tuple, typing.get_origin(Sequence[str])):
        return _base_type(typing.get_args(hint)[0])
    return hint


def _option(option: Option) -> Callable:
    spec = option.field.metadata["cli"]
    flag = spec["flag"] or "--" + option.key.replace("_", "-")
    names = [*flag.split("/"), option.key]
    kind = _base_type(option.hint)
    has_default = option.field.default is not dataclasses.MISSING
    default = option.field.default if has_default else None
    kwargs: dict[str, Any] = {"help": spec["help"]}
    if kind is bool:
        # A flag sets the field to the opposite of its default (--no-drift: drift=False).
        kwargs.update(is_flag=True, flag_value=not default, default=default, show_default=False)
        return click.option(*names, **kwargs)
    if spec["choices"]:
        kwargs["type"] = click.Choice(spec["choices"])
    else:
        kwargs["type"] = _CLICK_TYPES.get(kind, click.STRING)
    if spec["metavar"]:
        kwargs["metavar"] = spec["metavar"]
    if spec["multiple"]:
        kwargs["multiple"] = True
    elif default is not None:
        kwargs["default"] = default
    else:
        kwargs["show_default"] = False
    return click.option(*names, **kwargs)


def _on_command_line(option: Option) -> bool:
    spec = option.field.metadata["cli"]
    return not spec["argument"] and not spec["hidden"]


def config_options(command: Callable) -> Callable:
    """Add one click option per command-line field of `TrainConfig` and of its option groups,
    in field order.

    The command receives them as keyword arguments by flat name (`l2sp_form`), as
    `TrainConfig.from_options` takes them.
    """
    options = [option for option in options_of(TrainConfig) if _on_command_line(option)]
    for option in reversed(options):  # click applies decorators bottom-up
        command = _option(option)(command)
    return command


class SizeType(click.ParamType):
    """A click parameter for byte sizes (`80GB`, `500MB`, `2GiB`): the value is an int."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """Parse with `surgery.core.sizes.parse_size`; a bad size is a usage error."""
        from surgery.core.sizes import SizeError, parse_size

        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except SizeError as error:
            self.fail(str(error), param, ctx)


SIZE = SizeType()


def command_line(config: TrainConfig) -> list[str]:
    """The `surgery train` arguments that make `config`: BASE, OUT, then each option whose value
    is not its default (the inverse of `config_options`, so a printed command is the real one).
    """
    args = [str(config.base), str(config.output)]
    for option in options_of(TrainConfig):
        value = option.value(config)
        if not _on_command_line(option) or value == option.default:
            continue
        flag = flag_of(option.key, option.field.metadata)
        if isinstance(value, bool):
            args.append(flag)  # a flag sets the opposite of the default
            continue
        for item in value if option.field.metadata["cli"]["multiple"] else [value]:
            args += [flag, str(item)]
    return args
