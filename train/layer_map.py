"""The map from parameter names to layers that every strategy reads, built once per model."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from surgery.core.layers import find_stacks, inner_name, select_stack, stack_layer
from surgery.core.modules import ATTENTION_ONLY, ModuleFilter
from train.errors import TrainConfigError


@dataclass(frozen=True)
class LayerMap:
    """Each parameter name's index in the model's text layer stack (None: outside the stack).

    Attributes:
        layers: every parameter's layer (drift groups, LoRA's layers).
        narrowed: the same, with the parameters that `--modules` leaves out set to None, so
            that layer specs treat them as they treat an unnamed layer (`--freeze`, `--l2sp`);
            `layers` itself when there is no module filter.
        freezable: what `--freeze`'s layers reach: `narrowed`, or with `--attention-only` only
            the MLP parameters' layers (the paper's `LayerFreezer(attention_only=True)`).
        unregularized: parameters L2-SP leaves out whatever their lambda: with
            `--attention-only` the MLP parameters of every layer (the paper's
            `LayerRangeL2SPRegularizer(attention_only=True)`), else none.
    """

    layers: dict[str, int | None]
    narrowed: dict[str, int | None]
    freezable: dict[str, int | None]
    unregularized: frozenset[str] = frozenset()


def layer_map(
    names: Iterable[str],
    num_layers: int,
    modules: ModuleFilter | None = None,
    attention_only: bool = False,
) -> LayerMap:
    """The layers of a model's parameter names, checked against the checkpoint's layer count.

    Works on wrapped names too (`base_model.model.model.layers.3...` under peft).

    Args:
        names: the model's parameter names.
        num_layers: the checkpoint's text layer count.
        modules: the `--modules` filter.
        attention_only: `--attention-only` (never with `modules`).

    Raises:
        TrainConfigError: when the model's stack does not have the checkpoint's layer count.
    """
    names = list(names)
    stack = select_stack(find_stacks(names))
    if stack.num_layers != num_layers:
        raise TrainConfigError(
            f"the loaded model has {stack.num_layers} layers in {stack.prefix}, the checkpoint "
            f"{num_layers}: the layer specs would address the wrong layers"
        )
    layers = {name: stack_layer(name, stack) for name in names}
    if attention_only:
        # The reference's rule reads every parameter's name, in the layers or outside them.
        mlp = frozenset(n for n in names if ATTENTION_ONLY.matches(inner_name(n) or n))
        freezable = {name: layer if name in mlp else None for name, layer in layers.items()}
        return LayerMap(layers, layers, freezable, mlp)
    if modules is None:
        return LayerMap(layers, layers, layers)
    narrowed = {name: stack_layer(name, stack, modules) for name in names}
    return LayerMap(layers, narrowed, narrowed)
