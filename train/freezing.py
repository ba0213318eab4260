"""Layer freezing, and the map from parameter names to layers that every strategy uses."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from surgery.core.layers import find_stacks, select_stack, stack_layer
from surgery.core.modules import ModuleFilter
from train.errors import TrainConfigError

if TYPE_CHECKING:
    from torch import nn


def layer_map(
    names: Iterable[str], num_layers: int, modules: ModuleFilter | None = None
) -> dict[str, int | None]:
    """Each parameter name's index in the model's text layer stack (None: outside the stack, or
    left out by `modules`, so layer specs treat it as they treat an unnamed layer).

    Works on wrapped names too (`base_model.model.model.layers.3...` under peft).

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
    return {name: stack_layer(name, stack, modules) for name in names}


def freeze(
    model: nn.Module,
    layers: Iterable[int],
    num_layers: int,
    embeddings: bool = False,
    modules: ModuleFilter | None = None,
) -> list[str]:
    """Stop gradients for the given layers (and the embeddings and head when asked).

    Frozen parameters are left out of the optimizer (the Trainer only optimizes parameters that
    require grad), so they end bit-identical to the base.

    Args:
        model: the model, before any wrapping.
        layers: layer indices of the text stack.
        num_layers: the checkpoint's layer count (checked against the model).
        embeddings: also freeze the input embeddings and the output head (tied or not).
        modules: freeze only these modules of the layers (`--modules`).

    Returns:
        The names of the parameters frozen by this call.

    Raises:
        TrainConfigError: when nothing would be left to train.
    """
    selected = set(layers)
    names = layer_map((n for n, _ in model.named_parameters()), num_layers, modules)
    frozen = []
    for name, param in model.named_parameters():
        if names[name] in selected:
            param.requires_grad_(False)
            frozen.append(name)
    if embeddings:
        ids = set()
        for module in (model.get_input_embeddings(), model.get_output_embeddings()):
            if module is not None:
                for param in module.parameters():
                    param.requires_grad_(False)
                    ids.add(id(param))
        frozen += [n for n, p in model.named_parameters() if id(p) in ids]
    if not any(p.requires_grad for p in model.parameters()):
        raise TrainConfigError("--freeze and --freeze-embeddings leave nothing to train")
    return frozen
