"""L2-SP: a pull toward the starting point, lambda / 2 * ||w - w0||^2 per parameter.

The 1/2 is included, so a parameter's gradient gains lambda * (w - w0) and lambda reads like a
weight-decay coefficient toward w0 (AdamW's decay toward zero without the decoupling).

The gradient is added directly, once per optimizer step, after the last micro-batch's backward
pass: by then data parallelism has averaged the data gradients across ranks and gradient
accumulation has summed the micro-batches, so the penalty is counted exactly once (not once per
rank or per micro-batch) and is the same as adding the penalty to the loss of the full batch. It
is added before gradient clipping, as a loss term would be.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from surgery.core.layers import LayerValues

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass
class _Term:
    name: str
    param: torch.nn.Parameter
    reference: torch.Tensor
    strength: float


class L2SP:
    """The L2-SP penalty of a model's trainable parameters toward their current values.

    Only parameters with a positive lambda keep a reference copy (in their own dtype and device).
    """

    def __init__(self, terms: list[_Term]) -> None:
        self.terms = terms

    @classmethod
    def from_model(
        cls, model: nn.Module, values: LayerValues, layers: Mapping[str, int | None]
    ) -> L2SP:
        """Snapshot the reference w0 of every trainable parameter with lambda > 0.

        Args:
            model: the model holding the base weights (on its training device).
            values: lambda per layer; `default` for other layers and tensors outside the stack.
            layers: each parameter name's layer (see `freezing.layer_map`).

        Returns:
            The regularizer.
        """
        terms = []
        for name, param in model.named_parameters():
            strength = values.value_for(layers[name])
            if param.requires_grad and strength:
                terms.append(_Term(name, param, param.detach().clone(), float(strength)))
        return cls(terms)

    def __len__(self) -> int:
        return len(self.terms)

    def penalty(self) -> float:
        """sum over parameters of lambda / 2 * ||w - w0||^2 (for logging)."""
        import torch

        with torch.no_grad():
            return float(
                sum(
                    0.5 * t.strength * (t.param.float() - t.reference.float()).square().sum().item()
                    for t in self.terms
                )
            )

    def add_gradient(self, scale: float = 1.0) -> None:
        """Add `scale * lambda * (w - w0)` to each regularized parameter's gradient.

        Args:
            scale: the loss scale of fp16 mixed precision (the gradients are still scaled).
        """
        import torch

        with torch.no_grad():
            for term in self.terms:
                delta = (term.param - term.reference).mul_(term.strength * scale)
                if term.param.grad is None:
                    term.param.grad = delta.to(term.param.dtype)
                else:
                    term.param.grad.add_(delta.to(term.param.grad.dtype))
