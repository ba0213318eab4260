"""The mergekit config equivalent to a revert, soup or interpolate: written beside every output
as mergekit_config.yml, it reproduces the output with `surgery merge` or `mergekit-yaml`."""

from __future__ import annotations

from collections.abc import Sequence

from surgery.core.dtypes import CONFIG_NAMES
from surgery.core.layers import LayerValues, Stack, inner_name, stack_layer
from surgery.core.modules import ModuleFilter, group_part
from surgery.engine.reader import Checkpoint
from surgery.engine.recipe import local_path


def _name(checkpoint: Checkpoint) -> str:
    """A model as the config names it: `repo@revision`, or the absolute local path (the config
    then replays from any working directory)."""
    if checkpoint.hub is not None:
        return f"{checkpoint.hub.repo_id}@{checkpoint.hub.revision}"
    return local_path(checkpoint)


def with_local_paths(config: dict, models: Sequence[str], checkpoints: Sequence[Checkpoint]):
    """`config` (a mergekit config as the user wrote it) with each local model, named as typed
    (relative to the working directory then), replaced by its absolute path."""
    names = {
        model: local_path(ckpt)
        for model, ckpt in zip(models, checkpoints, strict=True)
        if ckpt.hub is None
    }

    def rename(node: object, key: str | None = None) -> object:
        if isinstance(node, dict):
            return {k: rename(v, k) for k, v in node.items()}
        if isinstance(node, list):
            return [rename(item, key) for item in node]
        if key in ("model", "base_model") and isinstance(node, str):
            return names.get(node, node)
        return node

    return rename(config)


def _dtype(config: dict, dtype: str | None) -> dict:
    if dtype in CONFIG_NAMES:
        config["dtype"] = CONFIG_NAMES[dtype]
    return config


def revert_config(
    base: Checkpoint,
    trained: Checkpoint,
    stack: Stack,
    layers: set[int],
    dtype: str | None,
    modules: ModuleFilter | None = None,
) -> dict | None:
    """passthrough slices: runs of layers from BASE or TRAINED. Embeddings, final norm and head
    come from the first and last slice's model, so empty TRAINED slices open and close the list
    when a run of BASE layers would. None when the model has several stacks (mergekit then
    needs per-module configs). With `modules`, slices cannot split a layer (passthrough takes
    no filters), so the config is the interpolation at alpha 0 on those modules (a byte copy:
    weights 1 and 0)."""
    if modules is not None:
        values = LayerValues(per_layer=dict.fromkeys(layers, 0.0))
        return interpolate_config(base, trained, values, stack, dtype, modules)
    if len(trained.stacks) != 1:
        return None
    runs: list[list] = []
    for layer in range(stack.num_layers):
        source = base if layer in layers else trained
        if runs and runs[-1][0] is source:
            runs[-1][2] = layer + 1
        else:
            runs.append([source, layer, layer + 1])
    if runs[0][0] is base:
        runs.insert(0, [trained, 0, 0])
    if runs[-1][0] is base:
        runs.append([trained, stack.num_layers, stack.num_layers])
    slices = [
        {"sources": [{"model": _name(model), "layer_range": [start, stop]}]}
        for model, start, stop in runs
    ]
    return _dtype({"merge_method": "passthrough", "slices": slices}, dtype)


def soup_config(experts: Sequence[Checkpoint], weights: Sequence[float], dtype: str | None):
    """linear, normalized by the weights' sum."""
    models = [
        {"model": _name(e), "parameters": {"weight": float(w)}}
        for e, w in zip(experts, weights, strict=True)
    ]
    return _dtype({"merge_method": "linear", "models": models}, dtype)


def _module_filters(
    names: Sequence[str], stack: Stack, layers: Sequence[int], modules: ModuleFilter | None
) -> dict[int, list[str]] | None:
    """mergekit `filter` strings (substrings of tensor names) that select each layer's tensors:
    the layer's prefix, or with `modules` its modules' prefixes (`model.layers.3.mlp.`) or, for
    a regex, the tensors' full names. None when some filter would also catch a tensor the
    filter leaves out (mergekit has no regexes), so no config is exact."""
    if modules is None:
        return {layer: [f"{stack.prefix}.{layer}."] for layer in layers}
    chosen = {name: stack_layer(name, stack, modules) for name in names}
    filters: dict[int, list[str]] = {layer: [] for layer in layers}
    for name, layer in chosen.items():
        if layer not in filters:
            continue
        inner = inner_name(name) or ""
        found = None if modules.pattern is not None else group_part(inner)
        parts = inner.split(".")
        text = name if found is None else name[: len(name) - len(inner)]
        text += ".".join(parts[: found[1] + 1]) + "." if found is not None else ""
        if text not in filters[layer]:
            filters[layer].append(text)
    for layer, texts in filters.items():
        if any(text in name and chosen[name] != layer for text in texts for name in names):
            return None
    return filters


def interpolate_config(
    base: Checkpoint,
    trained: Checkpoint,
    values: LayerValues,
    stack: Stack | None,
    dtype: str | None,
    modules: ModuleFilter | None = None,
) -> dict | None:
    """linear without normalization: weight 1 - alpha for BASE, alpha for TRAINED, per layer
    through filters on the layer's name prefix (or its modules' prefixes, see
    `_module_filters`); None when mergekit's substring filters cannot express `modules`."""
    filters = (
        _module_filters(list(trained.tensors), stack, sorted(values.per_layer), modules)
        if stack is not None
        else None
    )
    if stack is not None and values.per_layer and filters is None:
        return None

    def weights(of_trained: bool) -> object:
        def value(alpha: float | None) -> float:
            alpha = 1.0 if alpha is None else alpha
            return alpha if of_trained else 1.0 - alpha

        if stack is None or not values.per_layer:
            return value(values.default)
        return [
            *(
                {"filter": text, "value": value(alpha)}
                for layer, alpha in sorted(values.per_layer.items())
                for text in filters[layer]
            ),
            {"value": value(values.default)},
        ]

    models = [
        {"model": _name(base), "parameters": {"weight": weights(False)}},
        {"model": _name(trained), "parameters": {"weight": weights(True)}},
    ]
    config = {"merge_method": "linear", "models": models, "parameters": {"normalize": False}}
    return _dtype(config, dtype)
