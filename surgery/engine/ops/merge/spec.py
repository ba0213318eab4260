"""A merge described in plain data: what `surgery.mergekit_config` builds from a mergekit YAML.

Parameter settings keep mergekit's forms: a scalar, a gradient (a list of numbers interpolated
over a slice's layers), or conditional values (`{filter: mlp, value: ...}`, first match wins).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from surgery.core.errors import SurgeryError

Scalar = bool | int | float | str


@dataclass(frozen=True)
class Conditional:
    """A value that applies to tensors whose name contains `filter` (None or `*`: every tensor)."""

    value: object  # Scalar or list of Scalar (a gradient)
    filter: str | None = None


Setting = Scalar | list | Conditional


class MergeConfigError(SurgeryError):
    """A merge config asks for something unknown, unsupported or impossible."""


def _interpolate(values: list, t: float) -> object:
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return values[int(t * (len(values) - 1))]
    scaled = t * (len(values) - 1)
    low = int(scaled)
    high = min(len(values) - 1, low + 1)
    frac = scaled - low
    return (1 - frac) * values[low] + frac * values[high]


def evaluate(setting: Setting, tensor_name: str, t: float) -> object | None:
    """A setting's value for one tensor at layer position `t` (0 to 1 within its slice), as
    mergekit's `evaluate_setting` computes it; None when no conditional value matches."""
    if isinstance(setting, Conditional):
        setting = [setting]
    if isinstance(setting, bool | int | float | str):
        return setting
    if not setting:
        return None
    if all(isinstance(e, bool | int | float | str) for e in setting):
        return _interpolate(list(setting), t)
    for cond in setting:
        if cond.filter in (None, "*") or (tensor_name and cond.filter in tensor_name):
            return evaluate(cond.value, tensor_name, t)
    return None


@dataclass(frozen=True)
class SliceSource:
    """Layers [start, stop) of input model `model` (an index into `MergeSpec.models`)."""

    model: int
    start: int
    stop: int
    parameters: dict[str, Setting] = field(default_factory=dict)


@dataclass(frozen=True)
class OutputSlice:
    """Consecutive output layers merged from aligned layer ranges of several models."""

    sources: tuple[SliceSource, ...]
    base: int | None = None  # the slice's base model (an index), if it sets its own
    parameters: dict[str, Setting] = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        """Output layers this slice makes."""
        return self.sources[0].stop - self.sources[0].start


@dataclass(frozen=True)
class ModuleSpec:
    """One module of a `modules:` config (mergekit's `OutputModuleDefinition`): the text decoder,
    the vision tower or the projector of a multimodal model, merged from its own models.

    `slices` holds one slice of every model's full range for a module given `models:`
    (`sliced` False), the module's own slices for one given `slices:`.
    """

    name: str
    slices: tuple[OutputSlice, ...]
    sliced: bool = False
    parameters: dict[str, Setting] = field(default_factory=dict)


@dataclass(frozen=True)
class TokenSpec:
    """Where one token's embedding row comes from (mergekit's `TokenEmbeddingConfig`).

    `kind` is `model` (that model's row of the token), `zero`, `model_token` (that model's row
    of `token` or of row `token_id`) or None (mergekit's default rule); `model` indexes
    `MergeSpec.models`; `force` replaces the row even in models that have the token.
    """

    kind: str | None = None
    model: int | None = None
    token: str | None = None
    token_id: int | None = None
    force: bool = False


@dataclass(frozen=True)
class TokenizerSpec:
    """The output tokenizer: `source` (`union`, `base` or a model reference), per-token row
    sources, and the row count's padding (mergekit's `TokenizerConfig`)."""

    source: str
    tokens: tuple[tuple[str, TokenSpec], ...] = ()
    pad_to_multiple_of: int | None = None


@dataclass(frozen=True)
class MergeSpec:
    """A whole merge: method, models (paths, resolved above the engine), slices, parameters.

    `slices` is None for a `models:` config: every model's full layer range, one slice.
    """

    method: str
    models: tuple[str, ...]
    model_parameters: tuple[dict[str, Setting], ...]
    base: int | None = None
    slices: tuple[OutputSlice, ...] | None = None
    parameters: dict[str, Setting] = field(default_factory=dict)
    dtype: str | None = None  # safetensors names
    out_dtype: str | None = None
    tokenizer_source: str | None = None  # as given: "union", "base", a model, or None
    tokenizer: TokenizerSpec | None = None  # the tokenizer to build, None: copy the donor's
    chat_template: str | None = None
    seed: int = 0
    config: dict = field(default_factory=dict)  # the YAML as given, for the recipe
    # Compute as mergekit does, in `dtype` op by op (see `mergekit_arithmetic`), not in float32.
    mergekit_arithmetic: bool = False
    # A `modules:` config's modules, in the config's order (None otherwise).
    modules: tuple[ModuleSpec, ...] | None = None
