"""The recipe's second step: the model as it will train, frozen layers and LoRA adapters in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from train.freezing import freeze
from train.lora import apply_lora

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from surgery.core.layers import Stack
    from train.config import Strategies
    from train.layer_map import LayerMap


def prepare(
    model: PreTrainedModel, layers: LayerMap, strategies: Strategies, stack: Stack
) -> PreTrainedModel:
    """Freeze `--freeze`'s layers (and the embeddings), then wrap the model in LoRA adapters.

    Args:
        model: the loaded model.
        layers: its parameters' layers.
        strategies: the run's strategies (only freezing and LoRA act here).
        stack: BASE's text layer stack.

    Returns:
        The model to train (the peft model under `--lora`).

    Raises:
        TrainConfigError: nothing left to train.
    """
    frozen = strategies.frozen_layers
    freeze(model, frozen, layers.freezable, strategies.freeze_embeddings)
    if strategies.lora is None:
        return model
    # Adapters only where layers train: --freeze keeps its layers bit-identical under LoRA.
    keep = [i for i in range(stack.num_layers) if i not in set(frozen)]
    return apply_lora(model, strategies.lora, keep if frozen else None, stack.prefix, layers.layers)
