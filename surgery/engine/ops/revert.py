"""revert: chosen layers from BASE, everything else from TRAINED, as byte copies."""

from __future__ import annotations

from functools import partial

from surgery.core.errors import LayerSpecError, MismatchError
from surgery.core.layers import (
    format_layers,
    parse_layer_spec,
    require_modules,
    select_stack,
    stack_layer,
)
from surgery.core.modules import ATTENTION_ONLY, parse_module_filter
from surgery.engine.matching import Matching, match
from surgery.engine.ops.merge.equivalent import revert_config
from surgery.engine.plan import Plan, copy_of, trained_plan
from surgery.engine.quantized import refuse_cast, scale_pairs
from surgery.engine.reader import Checkpoint, TensorInfo
from surgery.engine.recipe import make_recipe

# What a revert does with tensors that have no counterpart (a vision tower on one side) or rows
# that differ (a grown vocabulary): neither is in the reverted layers.
LONELY = "the output keeps trained's layout and every tensor outside the reverted layers"


def _base_tensor(matching: Matching, name: str) -> TensorInfo:
    """BASE's tensor for TRAINED's `name`, which a revert copies.

    Raises:
        MismatchError: BASE has none, or one of another shape (a layer's tensors never grow).
    """
    tensor = matching.partner(name, 1)
    if tensor is None:
        raise MismatchError(f"{name!r} is to be reverted but base has no counterpart")
    if name in matching.rows:
        raise MismatchError(
            f"{name!r} is to be reverted but has shape {list(tensor.shape)} in base and "
            f"{list(matching.checkpoints[0].tensors[name].shape)} in trained"
        )
    return tensor


def plan_revert(
    base: Checkpoint,
    trained: Checkpoint,
    layers: str,
    *,
    stack: str | None = None,
    modules: str | None = None,
    attention_only: bool = False,
    dtype: str | None = None,
    base_role: str = "base",
    trained_base: str | None = None,
) -> Plan:
    """Plan a revert of `layers` (a layer spec such as `9:28`) of one stack to BASE.

    BASE's tensors are matched to TRAINED's by name across layouts (`surgery.engine.matching`:
    a multimodal BASE and its text-only fine-tune); the output keeps TRAINED's layout.
    Embeddings, final norm, head and other stacks (a vision tower) stay from TRAINED (whatever
    their rows: a grown vocabulary); with
    `modules` (`mlp`, `attn` or a name regex, see `surgery.core.modules`) only those tensors of
    the layers revert. `attention_only` is the paper's `WeightReverter(attention_only=True)`:
    only the MLP tensors of the layers revert (see `surgery.core.modules.ATTENTION_ONLY`), their
    attention and norms stay TRAINED's.

    `base_role` names BASE's role in the recipe: "donor" when BASE is not TRAINED's base (a
    graft of its layers); `trained_base` is the base TRAINED names, when it names one.

    Raises:
        MismatchError: the checkpoints do not line up.
        LayerSpecError: the spec does not parse or does not fit the model, or both `modules`
            and `attention_only` are given.
    """
    if attention_only and modules is not None:
        raise LayerSpecError("--attention-only and --modules both choose modules: give one")
    matching = match(
        [trained, base],
        ["trained", "base"],
        float_dtypes_may_differ=dtype is not None,
        vocabulary=True,
        lonely=LONELY,
    )
    refuse_cast(scale_pairs(trained), dtype)  # byte copies: scales go with their layer
    chosen_stack = select_stack(trained.stacks, stack)
    indices = set(parse_layer_spec(layers, chosen_stack.num_layers))
    module_filter = parse_module_filter(modules) if modules is not None else None
    if attention_only:
        module_filter = ATTENTION_ONLY
    if module_filter is not None:
        require_modules(module_filter, trained.tensors, chosen_stack, indices)
    tensors = []
    for name, tensor in trained.tensors.items():
        from_base = stack_layer(name, chosen_stack, module_filter) in indices
        source = _base_tensor(matching, name) if from_base else tensor
        tensors.append(copy_of(source, dtype, name=name))
    recipe = make_recipe(
        "revert",
        [(base_role, base), ("trained", trained)],
        layers=format_layers(indices),
        stack=chosen_stack.name,
        modules=modules,
        attention_only=attention_only or None,
        num_layers=chosen_stack.num_layers,
        dtype=dtype,
        matching=matching.record(["trained", base_role]),
        trained_base=trained_base,
    )
    mergekit = partial(revert_config, base, trained, chosen_stack, indices, dtype, module_filter)
    return trained_plan(
        "revert",
        tensors,
        recipe,
        base,
        trained,
        dtype,
        mergekit if matching.exact else None,
        shard_groups=[[t.name for t in shard.tensors] for shard in trained.shards],
    )
