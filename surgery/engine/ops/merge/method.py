"""What a merge method declares: its parameters, the inputs it accepts, and how it builds one
output tensor. One module per method fills these in; `registry` collects them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from surgery.engine.plan import OutputTensor
from surgery.engine.reader import TensorInfo

REQUIRED = object()  # a parameter without a default


class Scope(str, Enum):
    """Which inputs a parameter is set for, as in mergekit."""

    SHARED = "shared"  # one value per tensor
    INPUT = "input"  # one value per input model
    NON_BASE = "non_base"  # one value per input model except the base


@dataclass(frozen=True)
class Param:
    """A method parameter: name, scope, type (bool, float or int) and default."""

    name: str
    scope: Scope
    kind: type = float
    default: object = REQUIRED


class Base(str, Enum):
    """Whether a method takes a base model."""

    REQUIRED = "required"
    OPTIONAL = "optional"
    IGNORED = "ignored"  # a base model is merged like any other input


@dataclass(frozen=True)
class TensorJob:
    """Everything a method needs to build one output tensor."""

    name: str
    shape: tuple[int, ...]
    out_dtype: str
    inputs: list[TensorInfo]
    base: int | None  # index of the base model in `inputs`
    shared: dict[str, object]
    per_input: list[dict[str, object]]  # aligned with inputs; the base's holds INPUT params only
    seed: int = 0

    @property
    def non_base(self) -> list[int]:
        """Indices of the inputs that are not the base."""
        return [i for i in range(len(self.inputs)) if i != self.base]


@dataclass(frozen=True)
class Method:
    """A merge method: its parameters, input contract and tensor builder."""

    name: str
    params: tuple[Param, ...]
    build: Callable[[TensorJob], OutputTensor]
    base: Base = Base.IGNORED
    min_inputs: int = 1
    max_inputs: int | None = None
    non_base_count: tuple[int, int] | None = None  # (min, max) inputs besides the base
    random: bool = False  # draws random masks (DARE, DELLA): the seed matters, and is recorded
    notes: tuple[str, ...] = field(default=())

    def param(self, name: str) -> Param | None:
        """The parameter called `name`, if the method has one."""
        return next((p for p in self.params if p.name == name), None)
