"""mergekit YAML configs in, plain `MergeSpec`s out, validated by mergekit's own model.

This module sits above the engine: mergekit imports transformers, which the engine never does.
Every key is checked: one this tool does not support is an error naming it, never ignored.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from surgery.core.dtypes import parse_dtype
from surgery.engine.ops.merge import registry
from surgery.engine.ops.merge.spec import (
    Conditional,
    MergeConfigError,
    MergeSpec,
    OutputSlice,
    Setting,
    SliceSource,
)

_TOP = {"merge_method", "models", "slices", "base_model", "parameters", "dtype", "out_dtype"}
_TOP |= {"tokenizer_source"}
_UNSUPPORTED = {
    "modules": "modules (per-module configs)",
    "tokenizer": "tokenizer (vocabulary merging)",
    "chat_template": "chat_template",
}
_MODEL_KEYS = {"model", "parameters"}
_SLICE_KEYS = {"sources", "base_model", "parameters"}
_SOURCE_KEYS = {"model", "layer_range", "parameters"}


def _check_keys(entry: object, allowed: set[str], where: str) -> dict:
    if not isinstance(entry, dict):
        raise MergeConfigError(f"{where} must be a mapping, not {type(entry).__name__}")
    for key in entry:
        if key in _UNSUPPORTED:
            raise MergeConfigError(f"{where}: {_UNSUPPORTED[key]} is not supported")
        if key not in allowed:
            raise MergeConfigError(f"{where}: key {key!r} is not supported")
    return entry


def _check_structure(data: dict) -> None:
    _check_keys(data, _TOP, "config")
    for i, model in enumerate(data.get("models") or []):
        _check_keys(model, _MODEL_KEYS, f"models[{i}]")
    for i, out_slice in enumerate(data.get("slices") or []):
        _check_keys(out_slice, _SLICE_KEYS, f"slices[{i}]")
        for j, source in enumerate(out_slice.get("sources") or []):
            _check_keys(source, _SOURCE_KEYS, f"slices[{i}].sources[{j}]")


def _setting(value: object) -> Setting:
    """mergekit's validated parameter setting as plain data."""
    if isinstance(value, list):
        return [_setting(v) for v in value]
    if hasattr(value, "filter") and hasattr(value, "value"):
        return Conditional(value=_setting(value.value), filter=value.filter)
    return value


def _settings(parameters: dict | None) -> dict[str, Setting]:
    return {key: _setting(value) for key, value in (parameters or {}).items()}


def _model_name(reference: object) -> str:
    if getattr(reference, "lora", None) is not None:
        raise MergeConfigError(f"model {reference}: LoRA adapters (model+lora) are not supported")
    return str(reference)


def _dtype(name: str | None, key: str) -> str | None:
    if name is None:
        return None
    try:
        return parse_dtype(name)
    except Exception:
        raise MergeConfigError(f"{key} {name!r} is not a float dtype") from None


def _validate(data: dict):
    """mergekit's MergeConfiguration; its errors become one line."""
    from mergekit.config import MergeConfiguration
    from pydantic import ValidationError

    try:
        return MergeConfiguration.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise MergeConfigError(f"invalid mergekit config at {where}: {first['msg']}") from None
    except (RuntimeError, ValueError) as error:
        raise MergeConfigError(f"invalid mergekit config: {error}") from None


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
    if not isinstance(data, dict):
        raise MergeConfigError("the config must be a YAML mapping with a merge_method")
    _check_structure(data)
    config = _validate(data)
    registry.get(config.merge_method)
    if config.tokenizer_source not in (None, "base"):
        raise MergeConfigError(
            f"tokenizer_source {config.tokenizer_source!s} is not supported (only base)"
        )
    models: list[str] = []

    def index(reference: object) -> int:
        name = _model_name(reference)
        if name not in models:
            models.append(name)
        return models.index(name)

    params: dict[int, dict[str, Setting]] = {}
    slices = None
    if config.models:
        for entry in config.models:
            params[index(entry.model)] = _settings(entry.parameters)
    else:
        slices = tuple(
            OutputSlice(
                sources=tuple(
                    SliceSource(
                        index(s.model), s.layer_range[0], s.layer_range[1], _settings(s.parameters)
                    )
                    for s in out_slice.sources
                ),
                base=index(out_slice.base_model) if out_slice.base_model else None,
                parameters=_settings(out_slice.parameters),
            )
            for out_slice in config.slices
        )
    base = index(config.base_model) if config.base_model else None
    return MergeSpec(
        method=config.merge_method,
        models=tuple(models),
        model_parameters=tuple(params.get(i, {}) for i in range(len(models))),
        base=base,
        slices=slices,
        parameters=_settings(config.parameters),
        dtype=_dtype(config.dtype, "dtype"),
        out_dtype=_dtype(config.out_dtype, "out_dtype"),
        tokenizer_source=config.tokenizer_source,
        seed=seed,
        config=data,
    )


def read_config(path: str | Path, *, seed: int = 0) -> MergeSpec:
    """`parse_config` of a file.

    Raises:
        MergeConfigError: the file cannot be read, or see `parse_config`.
    """
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise MergeConfigError(f"cannot read config {path}: {error.strerror}") from None
    return parse_config(text, seed=seed)


def render_config(config: dict) -> str:
    """A config as mergekit YAML text."""
    return yaml.safe_dump(config, sort_keys=False)
