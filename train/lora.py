"""The LoRA baseline: adapters via peft, merged into full weights before saving."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from train.config import LoraSpec

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

_PEFT_PREFIX = "base_model.model."
_ADAPTER = "default"


def apply_lora(
    model: PreTrainedModel,
    spec: LoraSpec,
    layers: Sequence[int] | None,
    stack_prefix: str,
    layer_of: Mapping[str, int | None],
) -> PreTrainedModel:
    """Wrap the model with LoRA adapters; everything else (embeddings included) is frozen.

    Args:
        model: the causal LM.
        spec: rank, alpha, dropout, target modules.
        layers: the layers that get adapters (None: all), e.g. all but the `--freeze` ones.
        stack_prefix: the layer stack's prefix, e.g. "model.layers" (names the layer pattern).
        layer_of: each parameter name's layer (`LayerMap.layers`), for "all-linear".

    Returns:
        The peft model.
    """
    from peft import LoraConfig, get_peft_model

    all_linear = spec.targets == "all-linear"
    targets = _layer_linears(model, layer_of) if all_linear else list(spec.targets)
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


def _layer_linears(model: PreTrainedModel, layer_of: Mapping[str, int | None]) -> list[str]:
    """Names of the linear modules inside the layer stack ("all-linear", minus the head).

    peft's own "all-linear" shortcut cannot be combined with `layers_to_transform`.
    """
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, (nn.Linear, Conv1D)) and layer_of.get(f"{name}.weight") is not None
    }
    return sorted(names)


def merge_lora(model: PreTrainedModel) -> PreTrainedModel:
    """Fold the adapters into the base weights: W + (alpha / r) * B @ A, then drop them.

    Returns:
        The underlying transformers model with merged weights.
    """
    return model.merge_and_unload()


def merge_lora_state_dict(
    state_dict: Mapping[str, torch.Tensor], spec: LoraSpec
) -> dict[str, torch.Tensor]:
    """Fold adapters into a gathered peft state dict: W + (alpha / r) * B @ A, peft's names off.

    The same merge as `merge_lora`, done on full tensors gathered from FSDP shards (peft's
    own merge needs the unsharded modules).

    Args:
        state_dict: the peft model's full state dict (`base_model.model.` names).
        spec: the run's LoRA settings (for the scaling alpha / r).

    Returns:
        The transformers model's state dict, with merged weights.
    """
    scaling = spec.alpha / spec.r
    merged: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        plain = name.removeprefix(_PEFT_PREFIX)
        if ".lora_A." in plain or ".lora_B." in plain or ".lora_dropout." in plain:
            continue
        if ".base_layer." in plain:
            module = name.rsplit(".base_layer.", 1)[0]
            a = state_dict.get(f"{module}.lora_A.{_ADAPTER}.weight")
            b = state_dict.get(f"{module}.lora_B.{_ADAPTER}.weight")
            plain = plain.replace(".base_layer.", ".")
            if a is not None and b is not None and plain.endswith(".weight"):
                delta = (b.float() @ a.float()) * scaling
                tensor = (tensor.float() + delta).to(tensor.dtype)
        merged[plain] = tensor
    return merged
