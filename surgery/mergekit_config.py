"""mergekit YAML configs in, plain `MergeSpec`s out, checked by mergekit's schema.

Every key is checked (`surgery.mergekit_schema`, held equal to mergekit's `MergeConfiguration` by
the tests): one this tool does not support is an error naming it, never ignored.
"""

from __future__ import annotations

from collections.abc import Callable

import yaml

from surgery.core.dtypes import parse_dtype
from surgery.engine.ops.merge.spec import (
    MergeConfigError,
    MergeSpec,
    ModuleSpec,
    OutputSlice,
    Setting,
    SliceSource,
    TokenizerSpec,
    TokenSpec,
)
from surgery.mergekit_schema import validate


def _dtype(name: str | None, key: str) -> str | None:
    if name is None:
        return None
    try:
        return parse_dtype(name)
    except Exception:
        raise MergeConfigError(f"{key} {name!r} is not a float dtype") from None


def _slices(entries: list[dict], index: Callable[[str], int]) -> tuple[OutputSlice, ...]:
    """`slices:` entries as `OutputSlice`s (`index`: a model's position in the spec)."""
    return tuple(
        OutputSlice(
            sources=tuple(
                SliceSource(index(s["model"]), *s["layer_range"], s["parameters"])
                for s in out_slice["sources"]
            ),
            base=None if out_slice["base_model"] is None else index(out_slice["base_model"]),
            parameters=out_slice["parameters"],
        )
        for out_slice in entries
    )


def _modules(modules: dict[str, dict], index: Callable[[str], int]) -> tuple[ModuleSpec, ...]:
    """`modules:` as `ModuleSpec`s: a module's `models:` becomes one slice of their full ranges."""
    specs = []
    for name, module in modules.items():
        if module["slices"]:
            slices, sliced = _slices(module["slices"], index), True
        else:
            sources = tuple(
                SliceSource(index(m["model"]), 0, 0, m["parameters"]) for m in module["models"]
            )
            slices, sliced = (OutputSlice(sources),), False
        specs.append(ModuleSpec(name, slices, sliced, module["parameters"]))
    return tuple(specs)


def parse_config(text: str, *, seed: int = 0) -> MergeSpec:
    """Read a mergekit YAML config into a `MergeSpec`.

    Args:
        text: the YAML.
        seed: seed of the random masks of DARE and DELLA (recorded in the recipe).

    Raises:
        MergeConfigError: bad YAML, anything mergekit rejects, or anything not supported here.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise MergeConfigError(f"the config is not valid YAML: {error}".splitlines()[0]) from None
    config = validate(data)
    # Here, not at the top: the registry loads every method's kernel (and numpy), which
    # `render_config` (a revert's or a soup's card) never needs.
    from surgery.engine.ops.merge import registry

    registry.get(config["merge_method"])
    models: list[str] = []

    def index(name: str) -> int:
        if name not in models:
            models.append(name)
        return models.index(name)

    params: dict[int, dict[str, Setting]] = {}
    slices = None
    for entry in config["models"] or ():
        params[index(entry["model"])] = entry["parameters"]
    if config["slices"]:
        slices = _slices(config["slices"], index)
    modules = _modules(config["modules"], index) if config["modules"] else None
    base = None if config["base_model"] is None else index(config["base_model"])
    return MergeSpec(
        method=config["merge_method"],
        models=tuple(models),
        model_parameters=tuple(params.get(i, {}) for i in range(len(models))),
        base=base,
        slices=slices,
        parameters=config["parameters"],
        dtype=_dtype(config["dtype"], "dtype"),
        out_dtype=_dtype(config["out_dtype"], "out_dtype"),
        tokenizer_source=config["tokenizer_source"],
        tokenizer=_tokenizer_spec(config, models),
        chat_template=config["chat_template"],
        seed=seed,
        config=data,
        modules=modules,
    )


# --- Tokenizers ---


def _model_index(models: list[str], name: str, where: str) -> int:
    """The index of a model of the config; a token's row can only come from one."""
    if name not in models:
        raise MergeConfigError(
            f"{where}: {name} is not a model of the config ({', '.join(models)})"
        )
    return models.index(name)


def _token_spec(models: list[str], token: str, entry: dict) -> TokenSpec:
    source = entry["source"]
    if source is None:
        return TokenSpec(force=entry["force"])
    where = f"tokenizer.tokens[{token!r}].source"
    model = None if source["kind"] == "zero" else _model_index(models, source["model"], where)
    return TokenSpec(
        kind=source["kind"],
        model=model,
        token=source.get("token"),
        token_id=source.get("token_id"),
        force=entry["force"],
    )


def _tokenizer_spec(config: dict, models: list[str]) -> TokenizerSpec | None:
    """The tokenizer to build (`tokenizer_source` or the `tokenizer:` block), or None."""
    block = config["tokenizer"]
    if block is None:
        source = config["tokenizer_source"]
        return None if source is None else TokenizerSpec(source)
    tokens = tuple((t, _token_spec(models, t, e)) for t, e in block["tokens"].items())
    return TokenizerSpec(block["source"], tokens, block["pad_to_multiple_of"])


def render_config(config: dict) -> str:
    """A config as mergekit YAML text."""
    return yaml.safe_dump(config, sort_keys=False)
