"""Per-layer-group drift from the base (`--no-drift`, `--drift-groups`): ||w - w0|| / ||w0||
over each group's tensors, logged with the loss.

Not a strategy against forgetting but a monitor of it, plugged in the same way.
Computed where the weights are: the reference stays on the training device and each log line
moves one number per group to the host (summed over the ranks under FSDP2), never the weights.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from surgery.core.layers import layer_groups
from train.fields import cli
from train.sharding import all_reduce_sum, any_sharded, local
from train.strategies.base import Config, Strategies, Strategy

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import TrainerCallback

    from train.checkpoint_io import CheckpointLayout
    from train.layer_map import LayerMap
    from train.trainer import SurgeryTrainer

OUTSIDE = "outside"


@dataclass
class DriftOptions:
    """`TrainConfig.drift`: `log`, log per-group drift from BASE, and `groups`, the groups as a
    list of layer specs."""

    log: bool = field(default=True, metadata=cli("Do not log drift from BASE.", flag="--no-drift"))
    groups: str | None = field(
        default=None,
        metadata=cli(
            "Layer groups for drift logs, e.g. 0:9,9:28,28:34 [from --freeze/--l2sp, else thirds].",
            flag="--drift-groups",
            metavar="LAYERS",
        ),
    )


@dataclass(frozen=True)
class Drift(Strategy):
    """Drift from BASE per layer group, in every loss log line (not under LoRA).

    Attributes:
        groups: (label, layers) of the text stack; tensors outside it form "outside".
    """

    name = "drift"
    Options = DriftOptions

    groups: tuple[tuple[str, tuple[int, ...]], ...]

    @classmethod
    def plan(cls, config: Config, layout: CheckpointLayout, chosen: Strategies) -> Drift | None:
        """The groups: `--drift-groups`, else cut at the layers the strategies before it name
        (--freeze's, else --l2sp's), else thirds. Checked even with `--no-drift`."""
        num_layers = layout.text_stack.num_layers
        groups = layer_groups(config.drift.groups, num_layers, chosen.named_layers)
        return cls(groups=groups) if config.drift.log else None

    def attach(
        self,
        trainer: SurgeryTrainer,
        layers: LayerMap,
        strategies: Strategies,
        resume_from: Path | None,
    ) -> list[TrainerCallback]:
        """Copy BASE's trained parameters when they are bound (reusing the copies other
        strategies hold) and add the drift to each loss log line."""
        if strategies.lora is not None:
            return []

        def bind(model: nn.Module) -> None:
            # A collective under FSDP (every rank measures its shards); else rank 0 alone.
            if not (any_sharded(model) or trainer.is_world_process_zero()):
                return
            shared = dict(trainer.base_copies)
            monitor = DriftMonitor(model, self.groups, layers.layers, shared)
            trainer.log_hooks.append(lambda: {k: round(v, 6) for k, v in monitor.measure().items()})
            own = [r for name, (_, _, r) in monitor.params.items() if name not in shared]
            trainer.held_bytes["drift_reference"] = sum(r.nbytes for r in own)

        trainer.when_bound(bind)
        return []


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """A copy on the same device, in bfloat16 when that loses nothing (a bf16 base loaded in
    float32 costs 2 bytes per parameter, not 4)."""
    import torch

    copy = tensor.detach().clone()
    if copy.dtype == torch.float32:
        half = copy.to(torch.bfloat16)
        if torch.equal(half.float(), copy):
            return half
    return copy


class DriftMonitor:
    """Relative L2 distance of each layer group from the base weights.

    Keeps a copy of the trainable parameters only (frozen ones cannot drift), on their device
    and in their shard under FSDP2, or reuses the L2-SP reference where there is one; the norms
    of the base are computed once.

    Args:
        model: the model holding the base weights, frozen parameters already marked.
        groups: (label, layer indices) of the text stack; tensors outside it form "outside".
        layers: each parameter name's layer (see `train.layer_map`).
        shared: references already held (the L2-SP w0, by parameter name), reused as they are.
    """

    def __init__(
        self,
        model: nn.Module,
        groups: Sequence[tuple[str, Sequence[int]]],
        layers: Mapping[str, int | None],
        shared: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        import torch

        shared = shared or {}
        group_of_layer = {i: label for label, members in groups for i in members}
        self.sharded = any_sharded(model)
        self.labels: list[str] = []
        self.params: dict[str, tuple[int, nn.Parameter, torch.Tensor]] = {}
        norms: dict[str, torch.Tensor] = {}
        for name, param in model.named_parameters():
            layer = layers[name]
            label = OUTSIDE if layer is None else group_of_layer.get(layer)
            if label is None:
                continue
            if label not in norms:
                self.labels.append(label)
                norms[label] = torch.zeros((), dtype=torch.float64, device=local(param).device)
            weights = local(param.detach())
            norms[label] += weights.float().square().sum(dtype=torch.float64).to(norms[label])
            if param.requires_grad:
                reference = shared.get(name)
                reference = reference if reference is not None else _compact(weights)
                self.params[name] = (self.labels.index(label), param, reference)
        partial = [float(norms[label]) for label in self.labels]
        self.base_norm2 = all_reduce_sum(partial, self.sharded)

    def measure(self) -> dict[str, float]:
        """`{"drift/<group>": relative L2 drift}` for every group (a collective under FSDP2)."""
        import torch

        device = next((r.device for _, _, r in self.params.values()), torch.device("cpu"))
        diff2 = torch.zeros(len(self.labels), dtype=torch.float64, device=device)
        with torch.no_grad():
            for index, param, reference in self.params.values():
                delta = local(param.detach()).float() - reference.float()
                diff2[index] += delta.square().sum(dtype=torch.float64)
        totals = all_reduce_sum(diff2.tolist(), self.sharded)
        return {
            f"drift/{label}": math.sqrt(totals[i]) / max(math.sqrt(self.base_norm2[i]), 1e-12)
            for i, label in enumerate(self.labels)
        }
