"""Layer freezing: parameters that get no gradient, so they end bit-identical to the base."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from train.errors import TrainConfigError

if TYPE_CHECKING:
    from torch import nn


def freeze(
    model: nn.Module,
    layers: Iterable[int],
    layer_of: Mapping[str, int | None],
    embeddings: bool = False,
) -> list[str]:
    """Stop gradients for the given layers (and the embeddings and head when asked).

    Frozen parameters are left out of the optimizer (the Trainer only optimizes parameters that
    require grad), so they end bit-identical to the base.

    Args:
        model: the model, before any wrapping.
        layers: layer indices of the text stack.
        layer_of: each parameter name's layer, None for those `--modules` or
            `--attention-only` leaves out (`LayerMap.freezable`).
        embeddings: also freeze the input embeddings and the output head (tied or not).

    Returns:
        The names of the parameters frozen by this call.

    Raises:
        TrainConfigError: when nothing would be left to train.
    """
    selected = set(layers)
    frozen = []
    for name, param in model.named_parameters():
        if layer_of[name] in selected:
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
