"""Layer freezing (`--freeze`, `--freeze-embeddings`): parameters that get no gradient, so they
end bit-identical to the base."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from surgery.core.layers import parse_layer_spec
from train.errors import TrainConfigError
from train.fields import cli
from train.limits import require_attention_only_tensors
from train.strategies.base import Config, Strategies, Strategy

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedModel

    from surgery.core.layers import Stack
    from train.checkpoint_io import CheckpointLayout
    from train.layer_map import LayerMap


@dataclass
class FreezeOptions:
    """`TrainConfig.freeze`: `layers`, a layer spec of layers that get no gradient ("9:28"), and
    `embeddings`, which also freezes the input embeddings and the output head."""

    layers: str | None = field(
        default=None,
        metadata=cli("Layers that get no gradient, e.g. 9:28.", flag="--freeze", metavar="LAYERS"),
    )
    embeddings: bool = field(
        default=False,
        metadata=cli("Also freeze embeddings and head.", flag="--freeze-embeddings"),
    )


@dataclass(frozen=True)
class Freeze(Strategy):
    """Frozen layers (narrowed by --modules or --attention-only) and, if asked, the embeddings.

    Attributes:
        layers: the text stack's layers that get no gradient.
        embeddings: also the input embeddings and the output head.
    """

    name = "freeze"
    Options = FreezeOptions

    layers: tuple[int, ...]
    embeddings: bool

    @classmethod
    def plan(cls, config: Config, layout: CheckpointLayout, chosen: Strategies) -> Freeze | None:
        """`--freeze`'s layers, checked against BASE's layer count and tensors: each holds a
        tensor `--modules` selects, and with `--attention-only` they hold MLP tensors."""
        options = config.freeze
        num_layers = layout.text_stack.num_layers
        layers = tuple(parse_layer_spec(options.layers, num_layers)) if options.layers else ()
        if not layers and not options.embeddings:
            return None
        chosen.require_selected(layers, layout)
        if chosen.attention_only and layers:  # the rule acts on these layers' MLPs
            require_attention_only_tensors(layout.tensors, layout.text_stack, layers)
        return cls(layers=layers, embeddings=options.embeddings)

    @property
    def named_layers(self) -> tuple[int, ...]:
        """`--freeze`'s layers."""
        return self.layers

    def prepare(
        self, model: PreTrainedModel, layers: LayerMap, strategies: Strategies, stack: Stack
    ) -> PreTrainedModel:
        """Stop the gradients of the frozen layers (what `layers.freezable` reaches of them)."""
        freeze(model, self.layers, layers.freezable, self.embeddings)
        return model

    @classmethod
    def summary(cls, config: Config) -> list[str]:
        """`--freeze LAYERS`, `--freeze-embeddings`."""
        options = config.freeze
        items = [f"--freeze {options.layers}"] if options.layers is not None else []
        return items + (["--freeze-embeddings"] if options.embeddings else [])


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
