"""The English-mix curriculum (`--mix-until [NAME=]FRACTION`): a source mixed in only for the
first fraction of the steps, its share going to the others afterwards.

The mixture schedule (train/data.py) reads each source's `until`; this strategy sets it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from train.errors import TrainConfigError
from train.fields import cli
from train.strategies.base import Config, Strategies, Strategy

if TYPE_CHECKING:
    from train.checkpoint_io import CheckpointLayout
    from train.sources import DataSource


@dataclass
class CurriculumOptions:
    """`TrainConfig.curriculum`: `limits`, `[NAME=]FRACTION` specs (see `apply_mix_until`)."""

    limits: Sequence[str] = field(
        default=(),
        metadata=cli(
            "Keep a source only for this first fraction of steps (bare: the last "
            "--data source); its share goes to the others afterwards.",
            flag="--mix-until",
            metavar="[NAME=]FRACTION",
            multiple=True,
        ),
    )


@dataclass(frozen=True)
class Curriculum(Strategy):
    """Sources limited to the first steps.

    Attributes:
        limits: the `--mix-until` specs; `check` has set each limited source's `until` in the
            plan's sources, which the mixture schedule follows.
    """

    name = "curriculum"
    Options = CurriculumOptions

    limits: tuple[str, ...]

    @classmethod
    def check(cls, config: Config, sources: tuple[DataSource, ...]) -> tuple[DataSource, ...]:
        """The sources with their `until` set from `--mix-until`."""
        return apply_mix_until(sources, config.curriculum.limits)

    @classmethod
    def plan(
        cls, config: Config, layout: CheckpointLayout, chosen: Strategies
    ) -> Curriculum | None:
        """The limits, when `--mix-until` is given."""
        limits = tuple(config.curriculum.limits)
        return cls(limits=limits) if limits else None

    @classmethod
    def summary(cls, config: Config) -> list[str]:
        """`--mix-until LIMITS`."""
        limits = config.curriculum.limits
        return [f"--mix-until {','.join(limits)}"] if limits else []


def apply_mix_until(
    sources: tuple[DataSource, ...], specs: Sequence[str]
) -> tuple[DataSource, ...]:
    """Attach `--mix-until [NAME=]FRACTION` to sources; a bare fraction means the last source.

    Raises:
        TrainConfigError: on an unknown name, a fraction outside (0, 1], a bare fraction with a
            single source, or every source limited (no data would be left for the end).
    """
    by_name = {s.name: s for s in sources}
    for spec in specs:
        name, sep, value = spec.rpartition("=")
        if not sep:
            if len(sources) < 2:
                raise TrainConfigError("--mix-until needs at least two --data sources")
            name = sources[-1].name
        if name not in by_name:
            raise TrainConfigError(
                f"--mix-until {spec!r}: no --data source named {name!r} "
                f"(sources: {', '.join(by_name)})"
            )
        try:
            fraction = float(value)
        except ValueError:
            raise TrainConfigError(f"--mix-until {spec!r}: {value!r} is not a number") from None
        if not 0 < fraction <= 1:
            raise TrainConfigError(f"--mix-until {spec!r}: the fraction must be in (0, 1]")
        by_name[name] = replace(by_name[name], until=fraction)
    result = tuple(by_name[s.name] for s in sources)
    if all(s.until is not None for s in result):
        raise TrainConfigError("--mix-until limits every source; leave at least one unlimited")
    return result
