"""L2-SP (`--l2sp`, `--l2sp-form`): a pull toward the starting point, lambda * ||w - w0||^2 per
parameter.

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

import logging
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from surgery.core.layers import LayerValues, parse_layer_values
from train.errors import TrainConfigError
from train.fields import cli
from train.limits import require_attention_only_tensors
from train.sharding import all_reduce_sum, is_sharded, local
from train.strategies.base import Config, Strategies, Strategy

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PreTrainedModel, TrainerCallback

    from train.checkpoint_io import CheckpointLayout
    from train.layer_map import LayerMap
    from train.sources import DataSource
    from train.trainer import SurgeryTrainer

logger = logging.getLogger(__name__)

# `sum`: lambda * ||w - w0||^2 (the paper's code); `half`: lambda / 2 * ||w - w0||^2.
L2SP_FORMS = ("sum", "half")


@dataclass
class L2SPOptions:
    """`TrainConfig.l2sp`: `lambdas`, the per-layer lambda spec ("9:28=0.05,*=0.001"; `*` covers
    the other layers and the tensors outside the stack, embeddings and final norm, as in the
    paper's code), and `form`: "sum", lambda * ||w - w0||^2 per optimizer step (the paper's
    code), or "half", the textbook lambda / 2 * ||w - w0||^2."""

    lambdas: str | None = field(
        default=None,
        metadata=cli(
            "L2-SP strength lambda toward BASE per layer, e.g. '9:28=0.05,*=0.001' "
            "(penalty lambda * ||w - w0||^2 per optimizer step, see --l2sp-form).",
            flag="--l2sp",
            metavar="SPEC",
        ),
    )
    form: str = field(
        default="sum",
        metadata=cli(
            "sum: lambda * ||w - w0||^2, as the paper's code; half: lambda/2 * ||w - w0||^2.",
            flag="--l2sp-form",
            choices=L2SP_FORMS,
        ),
    )


@dataclass(frozen=True)
class L2SPToBase(Strategy):
    """The L2-SP penalty toward BASE, added to the gradients once per optimizer step.

    --modules narrows its ranges (a tensor it leaves out gets the `*` lambda); --attention-only
    leaves the MLPs out altogether (lambda 0), as the paper's code.

    Attributes:
        values: lambda per layer, `default` for the other layers and tensors outside the stack.
        form: "sum" or "half" (see `L2SP`).
    """

    name = "l2sp"
    Options = L2SPOptions
    needs_parameters = True

    values: LayerValues
    form: str

    @classmethod
    def check(cls, config: Config, sources: tuple[DataSource, ...]) -> tuple[DataSource, ...]:
        """The form is one of `L2SP_FORMS`."""
        if config.l2sp.form not in L2SP_FORMS:
            raise TrainConfigError(
                f"--l2sp-form {config.l2sp.form!r}: choose {' or '.join(L2SP_FORMS)}"
            )
        return sources

    @classmethod
    def plan(
        cls, config: Config, layout: CheckpointLayout, chosen: Strategies
    ) -> L2SPToBase | None:
        """The lambdas of `--l2sp`, checked against BASE's layer count and tensors: each range
        holds a tensor `--modules` selects, and with `--attention-only` (and no `--freeze`
        layers) the stack holds MLP tensors."""
        options = config.l2sp
        if not options.lambdas:
            return None
        values = parse_layer_values(options.lambdas, layout.text_stack.num_layers)
        chosen.require_selected(tuple(values.per_layer), layout)
        if chosen.attention_only and not chosen.frozen_layers:  # the rule acts on every layer
            require_attention_only_tensors(layout.tensors, layout.text_stack, ())
        return cls(values=check_lambdas(values, options.lambdas), form=options.form)

    def value_for(self, layer: int | None) -> float | None:
        """The lambda of a layer (None: a tensor outside the stack)."""
        return self.values.value_for(layer)

    @property
    def named_layers(self) -> tuple[int, ...]:
        """The layers of `--l2sp`'s ranges (not `*`)."""
        return tuple(self.values.per_layer)

    def attach(
        self,
        trainer: SurgeryTrainer,
        layers: LayerMap,
        strategies: Strategies,
        resume_from: Path | None,
    ) -> list[TrainerCallback]:
        """Snapshot the reference when the parameters are bound; add the penalty's gradient at
        every optimizer step and the penalty to the logs."""

        def bind(model: PreTrainedModel) -> None:
            l2sp = L2SP.from_model(
                model, self.values, layers.narrowed, self.form, layers.unregularized
            )
            trainer.gradient_hooks.append(l2sp.add_gradient)
            trainer.log_hooks.append(lambda: {"l2sp_penalty": l2sp.penalty()})
            # Drift measures against the same copies of BASE instead of holding its own.
            trainer.base_copies.update({t.name: t.reference for t in l2sp.terms})
            held = sum(t.reference.nbytes for t in l2sp.terms)
            trainer.held_bytes["l2sp_reference"] = held
            logger.info("L2-SP: %d regularized tensors, reference %d bytes", len(l2sp), held)

        trainer.when_bound(bind)
        return []

    @classmethod
    def summary(cls, config: Config) -> list[str]:
        """`--l2sp SPEC`, `--l2sp-form FORM`."""
        options = config.l2sp
        items = [f"--l2sp {options.lambdas}"] if options.lambdas is not None else []
        return items + ([f"--l2sp-form {options.form}"] if options.lambdas else [])


def check_lambdas(values: LayerValues, spec: str | None) -> LayerValues:
    """Refuse a negative or infinite L2-SP lambda in parsed `--l2sp` values."""
    for value in [*values.per_layer.values(), values.default]:
        if value is not None and (value < 0 or not math.isfinite(value)):
            raise TrainConfigError(f"--l2sp {spec!r}: lambda must be >= 0, got {value}")
    return values


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
