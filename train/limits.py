"""What a run may ask of BASE beyond what the spec parsers check: the layers that `--modules`
narrows, `--attention-only`'s combinations, and a block no longer than the model's context (the
strategies check their own options: train/strategies/).

`TrainConfig.validate` applies them once BASE's layout is known (the layers' checks in the
strategies' plans, `--modules` without layers in `train.strategies.choose`); the `--dry-run`
memory plan (train/memory_plan.py) applies the same ones to BASE's config.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from surgery.core.layers import require_modules
from surgery.core.modules import ATTENTION_ONLY
from train.errors import TrainConfigError

if TYPE_CHECKING:
    from surgery.core.layers import Stack
    from surgery.core.modules import ModuleFilter

DEFAULT_BLOCK = 1024


def require_narrowed_layers(modules: ModuleFilter | None, named: Sequence[int]) -> None:
    """Refuse `--modules` without layers for it to narrow (`named`: the `--freeze` layers, else
    `--l2sp`'s per-range ones)."""
    if modules is not None and not named:
        raise TrainConfigError("--modules narrows layers: give --freeze or per-range --l2sp")


def check_attention_only(
    modules: str | None, lora: str | None, freeze: str | None, l2sp: str | None
) -> None:
    """Refuse `--attention-only` where it contradicts another option or has nothing to act on
    (the other options' values as given).

    Raises:
        TrainConfigError: with `--modules` (both choose modules) or `--lora`, or without
            `--freeze` and `--l2sp`.
    """
    if modules is not None:
        raise TrainConfigError("--attention-only and --modules both choose modules: give one")
    if lora is not None:
        raise TrainConfigError("--attention-only does not apply to --lora (choose targets=...)")
    if not freeze and not l2sp:
        raise TrainConfigError("--attention-only acts on --freeze and --l2sp: give one of them")


def require_attention_only_tensors(
    names: Iterable[str], stack: Stack, frozen: Sequence[int]
) -> None:
    """Refuse `--attention-only` when it reaches no MLP tensor: none in the `--freeze` layers,
    or (with `--l2sp` alone) none in the whole stack, whose names the rule does not know.

    Raises:
        LayerSpecError: no tensor of those layers matches the reference's MLP names.
    """
    layers = frozen or range(stack.num_layers)
    require_modules(ATTENTION_ONLY, names, stack, layers)


def block_size(requested: int | None, config: Mapping) -> int:
    """The requested block, or min(1024, the model's context); never longer than the context.

    Raises:
        TrainConfigError: a requested block longer than the model's context.
    """
    text = config.get("text_config") or config
    limit = next((text[k] for k in ("max_position_embeddings", "n_positions") if k in text), None)
    block = requested or min(DEFAULT_BLOCK, limit or DEFAULT_BLOCK)
    if limit is not None and block > limit:
        raise TrainConfigError(f"--block-size {block} exceeds the model's context ({limit})")
    return block
