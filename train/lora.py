"""The LoRA baseline: adapters via peft, merged into full weights before saving."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from surgery.core.layers import layer_of
from train.config import LoraSpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def apply_lora(
    model: PreTrainedModel, spec: LoraSpec, layers: Sequence[int] | None, stack_prefix: str
) -> PreTrainedModel:
    """Wrap the model with LoRA adapters; everything else (embeddings included) is frozen.

    Args:
        model: the causal LM.
        spec: rank, alpha, dropout, target modules.
        layers: the layers that get adapters (None: all), e.g. all but the `--freeze` ones.
        stack_prefix: the layer stack's prefix, e.g. "model.layers" (names the layer pattern).

    Returns:
        The peft model.
    """
    from peft import LoraConfig, get_peft_model

    targets = _layer_linears(model) if spec.targets == "all-linear" else list(spec.targets)
    config = LoraConfig(
        task_type="CAUSAL_LM",
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=targets,
        layers_to_transform=list(layers) if layers is not None else None,
        layers_pattern=stack_prefix.rsplit(".", 1)[-1] if layers is not None else None,
    )
    return get_peft_model(model, config)


def _layer_linears(model: PreTrainedModel) -> list[str]:
    """Names of the linear modules inside the layer stack ("all-linear", minus the head).

    peft's own "all-linear" shortcut cannot be combined with `layers_to_transform`.
    """
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, (nn.Linear, Conv1D)) and layer_of(name + ".") is not None
    }
    return sorted(names)


def merge_lora(model: PreTrainedModel) -> PreTrainedModel:
    """Fold the adapters into the base weights: W + (alpha / r) * B @ A, then drop them.

    Returns:
        The underlying transformers model with merged weights.
    """
    return model.merge_and_unload()
