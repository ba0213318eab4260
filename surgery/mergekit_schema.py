"""mergekit's configuration schema (`MergeConfiguration`), checked without importing mergekit.

Importing mergekit's config model imports transformers, peft and torch: 4.1 s and 420 MB on the
reference machine, more than a whole streamed linear merge of three 1.9 GB models. So the keys
this tool supports are checked here with mergekit's own rules (types, pydantic's lax coercions
of `layer_range`, "exactly one of models or slices", model references `path[@revision]`), and a
test holds this schema to `MergeConfiguration` on every config of its corpus: whatever mergekit
rejects is rejected here too. This schema is stricter in one way: an unknown key anywhere is an
error (mergekit's models ignore extra keys silently).

`validate` returns the config as plain data: model references as strings, parameter settings
as `Setting`s (scalars, gradients, `Conditional`s).
"""

from __future__ import annotations

import math

from surgery.engine.ops.merge.spec import Conditional, MergeConfigError, Setting

_TOP = {"merge_method", "models", "slices", "base_model", "parameters", "dtype", "out_dtype"}
_TOP |= {"tokenizer_source", "tokenizer", "chat_template"}
_TOP |= {"modules"}
_UNSUPPORTED = {
    "residual_weight": "residual_weight",
}
_MODEL_KEYS = {"model", "parameters"}
_SLICE_KEYS = {"sources", "base_model", "parameters"}
_SOURCE_KEYS = {"model", "layer_range", "parameters"}
_CONDITIONAL_KEYS = {"value", "filter"}
_SCALARS = (bool, int, float, str)


def _fail(where: str, message: str) -> MergeConfigError:
    return MergeConfigError(f"invalid mergekit config at {where}: {message}")


def _mapping(entry: object, allowed: set[str], where: str) -> dict:
    if not isinstance(entry, dict):
        raise _fail(where, f"must be a mapping, not {type(entry).__name__}")
    for key in entry:
        if key in _UNSUPPORTED:
            raise MergeConfigError(f"{where}: {_UNSUPPORTED[key]} is not supported")
        if key not in allowed:
            raise MergeConfigError(f"{where}: key {key!r} is not supported")
    return entry


def _text(value: object, where: str, *, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _fail(where, f"must be a string, not {type(value).__name__}")
    return value


def model_reference(value: object, where: str) -> str:
    """A model reference as mergekit writes it: `path` or `path@revision` (a Hub id or folder).

    Raises:
        MergeConfigError: not a reference, more than one `@`, or a LoRA (`model+lora`).
    """
    if isinstance(value, dict):
        _mapping(value, {"model"}, where)
        path = value.get("model")
        if isinstance(path, dict):
            _mapping(path, {"path", "revision"}, f"{where}.model")
            name = _text(path.get("path"), f"{where}.model.path", optional=False)
            revision = _text(path.get("revision"), f"{where}.model.revision")
            return f"{name}@{revision}" if revision else name
        value = path
    name = _text(value, where, optional=False)
    if "+" in name:
        raise MergeConfigError(
            f"model {name}: LoRA adapters (model+lora) are not supported; mergekit-yaml applies "
            "them, or merge the adapter into its model first (peft's merge_and_unload)"
        )
    if name.count("@") > 1:
        raise _fail(where, f"invalid model path - multiple @: {name}")
    return name


def _setting(value: object, where: str) -> Setting:
    """One parameter setting: a scalar, a gradient (list of scalars), a conditional value
    (`{value, filter}`) or a list of conditional values."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, dict):
        return _conditional(value, where)
    if isinstance(value, list):
        if all(isinstance(v, _SCALARS) for v in value):
            return list(value)
        if all(isinstance(v, dict) for v in value):
            return [_conditional(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise _fail(where, "must be a number, string, boolean, list of them, or {value, filter}")


def _conditional(entry: dict, where: str) -> Conditional:
    _mapping(entry, _CONDITIONAL_KEYS, where)
    if "value" not in entry:
        raise _fail(f"{where}.value", "field required")
    value = entry["value"]
    scalars = isinstance(value, list) and all(isinstance(v, _SCALARS) for v in value)
    if not (isinstance(value, _SCALARS) or scalars):
        raise _fail(f"{where}.value", "must be a scalar or a list of scalars")
    return Conditional(value=value, filter=_text(entry.get("filter"), f"{where}.filter"))


def _parameters(value: object, where: str) -> dict[str, Setting]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(where, f"must be a mapping, not {type(value).__name__}")
    return {str(k): _setting(v, f"{where}.{k}") for k, v in value.items()}


def _layer(value: object, where: str) -> int:
    """pydantic's lax int: an int, an integral float, or a string holding an int."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _fail(where, "must be an integer")
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise _fail(where, f"must be an integer, not {value!r}") from None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise _fail(where, f"must be an integer, not {value}")
    return int(value)


def _layer_range(value: object, where: str) -> tuple[int, int]:
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise _fail(where, "must be a list of two layer numbers [start, stop]")
    return _layer(value[0], f"{where}[0]"), _layer(value[1], f"{where}[1]")


def _model_entry(entry: object, where: str) -> dict:
    _mapping(entry, _MODEL_KEYS, where)
    if "model" not in entry:
        raise _fail(f"{where}.model", "field required")
    return {
        "model": model_reference(entry["model"], f"{where}.model"),
        "parameters": _parameters(entry.get("parameters"), f"{where}.parameters"),
    }


def _source(entry: object, where: str) -> dict:
    _mapping(entry, _SOURCE_KEYS, where)
    for key in ("model", "layer_range"):
        if key not in entry:
            raise _fail(f"{where}.{key}", "field required")
    return {
        "model": model_reference(entry["model"], f"{where}.model"),
        "layer_range": _layer_range(entry["layer_range"], f"{where}.layer_range"),
        "parameters": _parameters(entry.get("parameters"), f"{where}.parameters"),
    }


def _slice(entry: object, where: str) -> dict:
    _mapping(entry, _SLICE_KEYS, where)
    sources = entry.get("sources")
    if not isinstance(sources, list):
        raise _fail(f"{where}.sources", "a list of sources is required")
    base = entry.get("base_model")
    return {
        "sources": [_source(s, f"{where}.sources[{i}]") for i, s in enumerate(sources)],
        "base_model": None if base is None else model_reference(base, f"{where}.base_model"),
        "parameters": _parameters(entry.get("parameters"), f"{where}.parameters"),
    }


def _entries(data: dict, key: str, where: str = "") -> list:
    value = data.get(key)
    if value is not None and not isinstance(value, list):
        raise _fail(f"{where}{key}", f"must be a list, not {type(value).__name__}")
    return value or []


# --- modules: (mergekit's OutputModuleDefinition): per-module models or slices, parameters ---
_MODULE_KEYS = {"models", "slices", "parameters"}


def _inputs(data: dict, where: str = "") -> tuple[list, list]:
    """The `models:` and `slices:` entries of the config or of a module (`where`: `modules.X.`)."""
    models = [
        _model_entry(m, f"{where}models[{i}]")
        for i, m in enumerate(_entries(data, "models", where))
    ]
    slices = [
        _slice(s, f"{where}slices[{i}]") for i, s in enumerate(_entries(data, "slices", where))
    ]
    return models, slices


def _module(entry: object, where: str) -> dict:
    _mapping(entry, _MODULE_KEYS, where)
    models, slices = _inputs(entry, f"{where}.")
    if bool(models) == bool(slices):
        raise _fail(where, "must specify either output slices or models to merge")
    return {
        "models": models or None,
        "slices": slices or None,
        "parameters": _parameters(entry.get("parameters"), f"{where}.parameters"),
    }


def _modules(data: dict) -> dict[str, dict] | None:
    """`modules:` as plain data (module name -> its models or slices, and parameters); None
    when absent or empty (mergekit then counts it as not given)."""
    value = data.get("modules")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _fail("modules", f"must be a mapping of module names, not {type(value).__name__}")
    return {str(name): _module(entry, f"modules.{name}") for name, entry in value.items()} or None


# --- mergekit-moe's config is another tool's ---
_MOE_KEYS = ("experts", "gate_mode", "experts_per_token", "shared_experts")


def _refuse_moe(data: dict) -> None:
    """A mergekit-moe config (`experts:`, `gate_mode`...) builds a mixture of experts: not a merge
    this tool runs."""
    found = [key for key in _MOE_KEYS if key in data]
    if found:
        raise MergeConfigError(
            f"config: {found[0]} makes this a mergekit-moe config (a mixture of experts); "
            "run it with mergekit-moe"
        )


def validate(data: object) -> dict:
    """Check a parsed mergekit YAML config and return it as plain data.

    Returns:
        A dict with `merge_method`, `models`, `slices` and `modules` (one of them set, the others
        None), `base_model`, `parameters`, `dtype`, `out_dtype`, `tokenizer_source`, `tokenizer`
        (its `source`, `tokens` and `pad_to_multiple_of`) and `chat_template`.

    Raises:
        MergeConfigError: one line naming the first problem and where it is.
    """
    if not isinstance(data, dict):
        raise MergeConfigError("the config must be a YAML mapping with a merge_method")
    _refuse_moe(data)
    _mapping(data, _TOP, "config")
    if "merge_method" not in data:
        raise _fail("merge_method", "field required")
    models, slices = _inputs(data)
    modules = _modules(data)
    if sum(map(bool, (models, slices, modules))) != 1:
        raise MergeConfigError(
            "invalid mergekit config: exactly one of 'models', 'slices', or 'modules' must be "
            "present"
        )
    base = data.get("base_model")
    return {
        "merge_method": _text(data["merge_method"], "merge_method", optional=False),
        "models": models or None,
        "slices": slices or None,
        "modules": modules,
        "base_model": None if base is None else model_reference(base, "base_model"),
        "parameters": _parameters(data.get("parameters"), "parameters"),
        "dtype": _text(data.get("dtype"), "dtype"),
        "out_dtype": _text(data.get("out_dtype"), "out_dtype"),
        **_tokenizer_keys(data),
    }


# --- Tokenizers (mergekit's `tokenizer_source`, `tokenizer:` and `chat_template`) ---

_TOKENIZER_KEYS = {"source", "tokens", "pad_to_multiple_of"}
_TOKEN_KEYS = {"source", "force"}
_EMBEDDING_KEYS = {"kind", "model", "token", "token_id"}


def _tokenizer_source(value: object, where: str) -> str:
    """`union`, `base` or a model reference."""
    if value in ("union", "base"):
        return value
    return model_reference(value, where)


def _token_source(value: object, where: str) -> dict | str | None:
    """A token's embedding source: None, a model reference, `{kind: zero}` or
    `{kind: model_token, model, token | token_id}` (mergekit's `TokenEmbeddingConfig.source`)."""
    if value is None:
        return None
    if not (isinstance(value, dict) and "kind" in value):
        return {"kind": "model", "model": model_reference(value, where)}
    _mapping(value, _EMBEDDING_KEYS, where)
    if value["kind"] == "zero":
        if set(value) != {"kind"}:
            raise _fail(where, "a zero embedding takes no other key")
        return {"kind": "zero"}
    if value["kind"] != "model_token":
        raise _fail(f"{where}.kind", "must be 'zero' or 'model_token'")
    if "model" not in value:
        raise _fail(f"{where}.model", "field required")
    token, token_id = value.get("token"), value.get("token_id")
    if (token is None) == (token_id is None):
        raise _fail(where, "give exactly one of token_id or token")
    if token_id is not None and (isinstance(token_id, bool) or not isinstance(token_id, int)):
        raise _fail(f"{where}.token_id", "must be an integer")
    return {
        "kind": "model_token",
        "model": model_reference(value["model"], f"{where}.model"),
        "token": _text(token, f"{where}.token"),
        "token_id": token_id,
    }


def _token(entry: object, where: str) -> dict:
    _mapping(entry, _TOKEN_KEYS, where)
    force = entry.get("force", False)
    if not isinstance(force, bool):
        raise _fail(f"{where}.force", "must be a boolean")
    return {"source": _token_source(entry.get("source"), f"{where}.source"), "force": force}


def _tokenizer_block(value: object) -> dict | None:
    if value is None:
        return None
    _mapping(value, _TOKENIZER_KEYS, "tokenizer")
    tokens = value.get("tokens") or {}
    if not isinstance(tokens, dict):
        raise _fail("tokenizer.tokens", "must be a mapping of tokens")
    pad = value.get("pad_to_multiple_of")
    if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int) or pad < 0):
        raise _fail("tokenizer.pad_to_multiple_of", "must be a positive integer")
    return {
        "source": _tokenizer_source(value.get("source", "union"), "tokenizer.source"),
        "tokens": {str(k): _token(v, f"tokenizer.tokens[{k!r}]") for k, v in tokens.items()},
        "pad_to_multiple_of": pad or None,  # 0 pads nothing, as in mergekit
    }


def _tokenizer_keys(data: dict) -> dict:
    """`tokenizer_source`, `tokenizer` and `chat_template`, checked as mergekit checks them."""
    source = data.get("tokenizer_source")
    block = _tokenizer_block(data.get("tokenizer"))
    if source is not None and block is not None:
        raise MergeConfigError(
            "invalid mergekit config: give tokenizer_source or tokenizer, not both"
        )
    return {
        "tokenizer_source": None
        if source is None
        else _tokenizer_source(source, "tokenizer_source"),
        "tokenizer": block,
        "chat_template": _text(data.get("chat_template"), "chat_template"),
    }
