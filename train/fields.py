"""The command-line declaration of a `TrainConfig` field, kept in the field's metadata.

Used by the general options (train/config.py) and by each strategy's `Options`
(train/strategies/), so that `surgery train`'s options are generated from the fields
(train/options.py) wherever they are declared.
"""

from __future__ import annotations

from collections.abc import Sequence


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
            bool field whose default is True, the flag turns it off (`--no-drift`).
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
