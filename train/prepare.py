"""The recipe's second step: the model as it will train, frozen layers and LoRA adapters in."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from surgery.core.layers import Stack
    from train.layer_map import LayerMap
    from train.strategies import Strategies


def prepare(
    model: PreTrainedModel, layers: LayerMap, strategies: Strategies, stack: Stack
) -> PreTrainedModel:
    """Each strategy's `prepare`, in registry order: freeze `--freeze`'s layers (and the
    embeddings), then wrap the model in LoRA adapters.

    Args:
        model: the loaded model.
        layers: its parameters' layers.
        strategies: the run's strategies.
        stack: BASE's text layer stack.

    Returns:
        The model to train (the peft model under `--lora`).

    Raises:
        TrainConfigError: nothing left to train.
    """
    for strategy in strategies:
        model = strategy.prepare(model, layers, strategies, stack)
    return model
