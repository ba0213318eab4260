"""L2-SP: a pull toward the starting point, lambda * ||w - w0||^2 per parameter.

Two forms (`--l2sp-form`):
- `sum` (the default): lambda * ||w - w0||^2, as the paper's public code adds it to the loss
  (`LayerRangeL2SPRegularizer.penalty`: sum_p lambda_p * sum (w - w0)^2, no 1/2); a parameter's
  gradient gains 2 * lambda * (w - w0).
- `half`: the textbook lambda / 2 * ||w - w0||^2; the gradient gains lambda * (w - w0), so lambda
  reads like a weight-decay coefficient toward w0 (AdamW's decay toward zero without the
  decoupling). The same lambda pulls half as hard as in `sum`.

The gradient is added directly, once per optimizer step, after the last micro-batch's backward
pass: by then data parallelism has averaged the data gradients across ranks and gradient
accumulation has summed the micro-batches, so the penalty is counted exactly once (not once per
rank or per micro-batch) and is the same as adding the penalty to the loss of the full batch. It
is added before gradient clipping, as a loss term would be.

Under FSDP2 the reference is a shard: each rank keeps `local(w0)` of its own parameter shard
(4 bytes per parameter / ranks in float32) and adds `lambda * (w - w0)` to its own gradient
shard; the penalty for the log is a per-rank sum reduced with one all-reduce. Nothing is
gathered, and the result equals the unsharded computation element for element.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from surgery.core.layers import LayerValues
from train.sharding import all_reduce_sum, is_sharded, local

if TYPE_CHECKING:
    import torch
    from torch import nn

# `sum`: lambda * ||w - w0||^2 (the paper's code); `half`: lambda / 2 * ||w - w0||^2.
L2SP_FORMS = ("sum", "half")


@dataclass
class _Term:
    name: str
    param: torch.nn.Parameter
    reference: torch.Tensor
    strength: float


class L2SP:
    """The L2-SP penalty of a model's trainable parameters toward their current values.

    Only parameters with a positive lambda keep a reference copy (in their own dtype and device;
    this rank's shard only under FSDP2).
    """

    def __init__(self, terms: list[_Term], form: str = "sum") -> None:
        if form not in L2SP_FORMS:
            raise ValueError(f"L2-SP form {form!r}: choose {' or '.join(L2SP_FORMS)}")
        self.terms = terms
        self.form = form
        # Penalty factor * lambda * ||w - w0||^2, gradient 2 * factor * lambda * (w - w0).
        self.factor = 1.0 if form == "sum" else 0.5
        self.sharded = any(is_sharded(t.param) for t in terms)

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        values: LayerValues,
        layers: Mapping[str, int | None],
        form: str = "sum",
        exempt: Collection[str] = frozenset(),
    ) -> L2SP:
        """Snapshot the reference w0 of every trainable parameter with lambda > 0.

        Args:
            model: the model holding the base weights (on its training device).
            values: lambda per layer; `default` for other layers and tensors outside the stack.
            layers: each parameter name's layer (see `train.layer_map`).
            form: "sum" (lambda * ||w - w0||^2) or "half" (lambda / 2 * ||w - w0||^2).
            exempt: parameters with no penalty whatever their layer's lambda
                (`--attention-only`'s MLPs, `LayerMap.unregularized`).

        Returns:
            The regularizer.
        """
        terms = []
        for name, param in model.named_parameters():
            strength = 0.0 if name in exempt else values.value_for(layers[name])
            if param.requires_grad and strength:
                reference = local(param.detach()).clone()
                terms.append(_Term(name, param, reference, float(strength)))
        return cls(terms, form)

    def __len__(self) -> int:
        return len(self.terms)

    def penalty(self) -> float:
        """sum over parameters of lambda * ||w - w0||^2 (times 1/2 in the `half` form), for
        logging; a collective when sharded: every rank must call it."""
        import torch

        with torch.no_grad():
            total = torch.zeros((), dtype=torch.float64, device=self._device())
            for t in self.terms:
                delta = local(t.param.detach()).float() - t.reference.float()
                total += self.factor * t.strength * delta.square().sum(dtype=torch.float64)
            # One number crosses to the host (and over the ranks), not the weights.
            return all_reduce_sum([float(total)], self.sharded)[0]

    def _device(self) -> torch.device:
        import torch

        return self.terms[0].reference.device if self.terms else torch.device("cpu")

    def add_gradient(self, scale: float = 1.0) -> None:
        """Add the penalty's gradient, `scale * 2 * factor * lambda * (w - w0)`, to each
        regularized parameter's gradient.

        Args:
            scale: the loss scale of fp16 mixed precision (the gradients are still scaled).
        """
        import torch

        with torch.no_grad():
            for term in self.terms:
                weights = local(term.param.detach())
                delta = (weights - term.reference).mul_(2 * self.factor * term.strength * scale)
                if term.param.grad is None:
                    # No data gradient reached it (an unused parameter): the penalty's alone.
                    term.param.grad = _like(term.param, delta.to(weights.dtype))
                else:
                    grad = local(term.param.grad)
                    grad.add_(delta.to(grad.dtype))


def _like(param: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:
    """A gradient for `param` from this rank's shard (a DTensor with its layout when sharded)."""
    if not is_sharded(param):
        return shard
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        shard, param.device_mesh, param.placements, shape=param.shape, stride=param.stride()
    )
