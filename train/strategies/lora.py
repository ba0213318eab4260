"""The LoRA baseline (`--lora`): adapters via peft, merged into full weights before saving."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from train.errors import TrainConfigError
from train.fields import cli
from train.strategies.base import Config, Strategies, Strategy

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from surgery.core.layers import Stack
    from train.checkpoint_io import CheckpointLayout
    from train.layer_map import LayerMap
    from train.sources import DataSource

_PEFT_PREFIX = "base_model.model."
_ADAPTER = "default"


@dataclass
class LoRAOptions:
    """`TrainConfig.lora`: `spec`, "r=16,alpha=32[,dropout=..][,targets=a+b]"; the adapters are
    merged into full weights when saved."""

    spec: str | None = field(
        default=None,
        metadata=cli(
            "LoRA baseline (merged when saved), e.g. "
            "r=16,alpha=32[,dropout=0.05][,targets=q_proj+v_proj].",
            flag="--lora",
            metavar="r=R,alpha=A",
        ),
    )


@dataclass(frozen=True)
class LoRA(Strategy):
    """LoRA hyperparameters; `targets` is "all-linear" or a list of module names."""

    name = "lora"
    Options = LoRAOptions
    needs_parameters = True

    r: int
    alpha: float
    dropout: float = 0.0
    targets: str | tuple[str, ...] = "all-linear"

    @classmethod
    def check(cls, config: Config, sources: tuple[DataSource, ...]) -> tuple[DataSource, ...]:
        """The spec parses; no --l2sp, --ema or --modules beside it."""
        if not config.lora.spec:
            return sources
        parse_lora(config.lora.spec)
        if config.l2sp.lambdas or config.ema.alpha is not None:
            raise TrainConfigError("--lora is a baseline on its own: drop --l2sp and --ema")
        if config.modules is not None:
            raise TrainConfigError("--modules does not apply to --lora (choose targets=...)")
        return sources

    @classmethod
    def plan(cls, config: Config, layout: CheckpointLayout, chosen: Strategies) -> LoRA | None:
        """The adapters' settings, when `--lora` is given."""
        return parse_lora(config.lora.spec) if config.lora.spec else None

    def prepare(
        self, model: PreTrainedModel, layers: LayerMap, strategies: Strategies, stack: Stack
    ) -> PreTrainedModel:
        """Wrap the model in adapters: only where layers train, so --freeze keeps its layers
        bit-identical under LoRA."""
        frozen = set(strategies.frozen_layers)
        keep = [i for i in range(stack.num_layers) if i not in frozen]
        return apply_lora(model, self, keep if frozen else None, stack.prefix, layers.layers)

    def weights(
        self, model: PreTrainedModel, state_dict: dict | None, main: bool
    ) -> tuple[PreTrainedModel, dict | None]:
        """The adapters merged into the base weights (on the gathered state dict under FSDP)."""
        if state_dict is None:
            return merge_lora(model), None
        return model.get_base_model(), merge_lora_state_dict(state_dict, self) if main else {}

    @classmethod
    def summary(cls, config: Config) -> list[str]:
        """`--lora SPEC`."""
        return [f"--lora {config.lora.spec}"] if config.lora.spec is not None else []


def parse_lora(spec: str) -> LoRA:
    """Parse `r=16,alpha=32[,dropout=0.05][,targets=q_proj+v_proj]`; alpha defaults to r.

    Raises:
        TrainConfigError: on unknown keys, a missing or non-positive r, or bad numbers.
    """
    values: dict[str, str] = {}
    for item in (part.strip() for part in spec.split(",") if part.strip()):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in ("r", "alpha", "dropout", "targets"):
            raise TrainConfigError(
                f"--lora {spec!r}: {item!r} is not one of r=, alpha=, dropout=, targets="
            )
        values[key.strip()] = value.strip()
    try:
        r = int(values["r"])
        alpha = float(values.get("alpha", r))
        dropout = float(values.get("dropout", 0.0))
    except KeyError:
        raise TrainConfigError(f"--lora {spec!r}: r= is required, e.g. r=16,alpha=32") from None
    except ValueError as error:
        raise TrainConfigError(f"--lora {spec!r}: {error}") from None
    if r <= 0 or alpha <= 0 or not 0 <= dropout < 1:
        raise TrainConfigError(f"--lora {spec!r}: need r > 0, alpha > 0, 0 <= dropout < 1")
    targets_text = values.get("targets", "all-linear")
    targets = targets_text if targets_text == "all-linear" else tuple(targets_text.split("+"))
    return LoRA(r=r, alpha=alpha, dropout=dropout, targets=targets)


def apply_lora(
    model: PreTrainedModel,
    spec: LoRA,
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
    state_dict: Mapping[str, torch.Tensor], spec: LoRA
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
