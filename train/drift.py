"""Per-layer-group drift from the base: ||w - w0|| / ||w0|| over each group's tensors."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

OUTSIDE = "outside"


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU copy, in bfloat16 when that loses nothing (weights loaded from a bf16 base)."""
    import torch

    copy = tensor.detach().to("cpu", copy=True)
    if copy.dtype == torch.float32:
        half = copy.to(torch.bfloat16)
        if torch.equal(half.float(), copy):
            return half
    return copy


class DriftMonitor:
    """Relative L2 distance of each layer group from the base weights.

    Keeps a CPU copy of the trainable parameters only (frozen ones cannot drift); the norms of
    the base are computed once.

    Args:
        model: the model holding the base weights, frozen parameters already marked.
        groups: (label, layer indices) of the text stack; tensors outside it form "outside".
        layers: each parameter name's layer (see `freezing.layer_map`).
    """

    def __init__(
        self,
        model: nn.Module,
        groups: Sequence[tuple[str, Sequence[int]]],
        layers: Mapping[str, int | None],
    ) -> None:
        group_of_layer = {i: label for label, members in groups for i in members}
        self.params: dict[str, tuple[str, nn.Parameter, torch.Tensor]] = {}
        self.base_norm2: dict[str, float] = {}
        for name, param in model.named_parameters():
            layer = layers[name]
            label = OUTSIDE if layer is None else group_of_layer.get(layer)
            if label is None:
                continue
            self.base_norm2[label] = self.base_norm2.get(label, 0.0) + float(
                param.detach().float().square().sum()
            )
            if param.requires_grad:
                self.params[name] = (label, param, _compact(param))

    def measure(self) -> dict[str, float]:
        """`{"drift/<group>": relative L2 drift}` for every group."""
        import torch

        diff2 = dict.fromkeys(self.base_norm2, 0.0)
        with torch.no_grad():
            for label, param, reference in self.params.values():
                delta = param.detach().float().cpu() - reference.float()
                diff2[label] += float(delta.square().sum())
        return {
            f"drift/{label}": math.sqrt(diff2[label]) / max(math.sqrt(norm2), 1e-12)
            for label, norm2 in self.base_norm2.items()
        }
