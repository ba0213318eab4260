"""The recipe's first step: BASE's model, its tokenizer and the map of its layers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from train.checkpoint_io import CheckpointLayout, load_for_training
from train.layer_map import LayerMap, layer_map

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from surgery.core.modules import ModuleFilter


def load(
    layout: CheckpointLayout,
    dtype: torch.dtype,
    modules: ModuleFilter | None,
    *,
    attention_only: bool = False,
    progress: bool,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, LayerMap]:
    """Load BASE for training (see `load_for_training`) and map its parameters to layers.

    Args:
        layout: BASE's layout.
        dtype: the training dtype.
        modules: the `--modules` filter that narrows the layer specs.
        attention_only: `--attention-only` (see `train.layer_map.LayerMap`).
        progress: show transformers' loading bar.

    Returns:
        The model, the tokenizer (no length limit: packing splits long documents), and the
        layers of the model's parameters (before any wrapping).
    """
    from transformers import AutoTokenizer

    model = load_for_training(layout, dtype, progress=progress)
    tokenizer = AutoTokenizer.from_pretrained(layout.folder, trust_remote_code=False)
    tokenizer.model_max_length = int(1e30)  # packing splits long documents; no length warning
    names = (n for n, _ in model.named_parameters())
    layers = layer_map(names, layout.text_stack.num_layers, modules, attention_only)
    return model, tokenizer, layers
