"""The command-line declaration of a `TrainConfig` field, and the walk over the fields.

`cli` is used by the general options (train/config.py) and by each strategy's option group
(its `Options`, train/strategies/), so that `surgery train`'s options are generated from the
fields (train/options.py) wherever they are declared. `TrainConfig` holds each group in one
field (`config.l2sp.form`); the command line and the training record name every option flat,
by its flag (`--l2sp-form`, `l2sp_form`): `options_of`, `flatten` and `nest` go between the two.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from typing import Any


def cli(
    help: str = "",
    *,
    flag: str | None = None,
    metavar: str | None = None,
    multiple: bool = False,
    choices: Sequence[str] | None = None,
    argument: bool = False,
    hidden: bool = False,
) -> dict:
    """A field's command-line declaration, kept in the dataclass field's metadata.

    Args:
        help: the option's help text.
        flag: the option's name(s) when not `--field-name`, e.g. "--lr" or "-q/--quiet". For a
            bool field whose default is True, the flag turns it off (`--no-drift`). A field of
            an option group always gives it: the flag, not the field, names the option.
        metavar, multiple, choices: as in click.
        argument: a positional argument (BASE, OUT), declared by the command itself.
        hidden: not on the command line (Python API only).

    Returns:
        The metadata mapping.
    """
    return {
        "cli": {
            "help": help,
            "flag": flag,
            "metavar": metavar,
            "multiple": multiple,
            "choices": tuple(choices) if choices else None,
            "argument": argument,
            "hidden": hidden,
        }
    }


def flag_of(name: str, metadata: dict) -> str:
    """The long flag of a field, as `surgery train` spells it (`--l2sp`, `--no-drift`)."""
    return (metadata["cli"]["flag"] or "--" + name.replace("_", "-")).split("/")[-1]


@dataclasses.dataclass(frozen=True)
class Option:
    """One command-line option of a config class, where the class holds it.

    Attributes:
        key: its flat name: the click parameter's and the training record's (`l2sp_form`).
        group: the field holding its option group (`l2sp`), None for a general field.
        field: its dataclass field (in the group's class for a group's option).
        hint: its type.
    """

    key: str
    group: str | None
    field: dataclasses.Field
    hint: Any

    @property
    def default(self) -> Any:
        """The field's default (MISSING for BASE, OUT and data)."""
        if self.field.default_factory is not dataclasses.MISSING:
            return self.field.default_factory()
        return self.field.default

    def value(self, config: Any) -> Any:
        """Its value in `config`."""
        holder = getattr(config, self.group) if self.group else config
        return getattr(holder, self.field.name)


def _group_key(field: dataclasses.Field) -> str:
    """A group field's flat name, from its flag: `--l2sp-form` -> l2sp_form, `--no-drift` ->
    drift (the flag turns the field off)."""
    return flag_of(field.name, field.metadata).removeprefix("--no-").lstrip("-").replace("-", "_")


def options_of(cls: type) -> tuple[Option, ...]:
    """Every option of a config class in field order, each group's options in its place.

    Raises:
        TypeError: two options of one flat name (a group's flag that another option has).
    """
    hints = typing.get_type_hints(cls)
    options: list[Option] = []
    for field in dataclasses.fields(cls):
        group = hints[field.name]
        if not dataclasses.is_dataclass(group):
            options.append(Option(field.name, None, field, group))
            continue
        inner = typing.get_type_hints(group)
        for option in dataclasses.fields(group):
            options.append(Option(_group_key(option), field.name, option, inner[option.name]))
    keys = [option.key for option in options]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise TypeError(f"{cls.__name__}: options named twice: {', '.join(repeated)}")
    return tuple(options)


def flatten(config: Any) -> dict:
    """`config`'s values by flat name, in field order (the training record's `config`)."""
    return {option.key: option.value(config) for option in options_of(type(config))}


def nest(cls: type, values: Mapping[str, Any]) -> Any:
    """A `cls` from values by flat name (the inverse of `flatten`); a group or field not
    named keeps its default.

    Raises:
        TypeError: a name that is no option of `cls`.
    """
    options = {option.key: option for option in options_of(cls)}
    unknown = sorted(set(values) - set(options))
    if unknown:
        raise TypeError(f"{cls.__name__}: no option {', '.join(map(repr, unknown))}")
    general: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        option = options[key]
        if option.group is None:
            general[key] = value
        else:
            groups.setdefault(option.group, {})[option.field.name] = value
    hints = typing.get_type_hints(cls)
    return cls(**general, **{name: hints[name](**kw) for name, kw in groups.items()})
