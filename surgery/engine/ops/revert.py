"""revert: chosen layers from BASE, everything else from TRAINED, as byte copies."""

from __future__ import annotations

from surgery.core.errors import LayerSpecError
from surgery.core.layers import (
    format_layers,
    parse_layer_spec,
    require_modules,
    select_stack,
    stack_layer,
)
from surgery.core.modules import ATTENTION_ONLY, parse_module_filter
from surgery.engine.ops.merge.equivalent import revert_config
from surgery.engine.plan import Plan, check_compatible, copy_of
from surgery.engine.quantized import refuse_cast, scale_pairs
from surgery.engine.reader import Checkpoint
from surgery.engine.recipe import make_recipe


def plan_revert(
    base: Checkpoint,
    trained: Checkpoint,
    layers: str,
    *,
    stack: str | None = None,
    modules: str | None = None,
    attention_only: bool = False,
    dtype: str | None = None,
) -> Plan:
    """Plan a revert of `layers` (a layer spec such as `9:28`) of one stack to BASE.

    Embeddings, final norm, head and other stacks (a vision tower) stay from TRAINED; with
    `modules` (`mlp`, `attn` or a name regex, see `surgery.core.modules`) only those tensors of
    the layers revert. `attention_only` is the paper's `WeightReverter(attention_only=True)`:
    only the MLP tensors of the layers revert (see `surgery.core.modules.ATTENTION_ONLY`), their
    attention and norms stay TRAINED's.

    Raises:
        MismatchError: the checkpoints do not line up.
        LayerSpecError: the spec does not parse or does not fit the model, or both `modules`
            and `attention_only` are given.
    """
    if attention_only and modules is not None:
        raise LayerSpecError("--attention-only and --modules both choose modules: give one")
    check_compatible(
        [trained, base], ["trained", "base"], float_dtypes_may_differ=dtype is not None
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
        tensors.append(copy_of(base.tensors[name] if from_base else tensor, dtype))
    recipe = make_recipe(
        "revert",
        [("base", base), ("trained", trained)],
        layers=format_layers(indices),
        stack=chosen_stack.name,
        modules=modules,
        attention_only=attention_only or None,
        num_layers=chosen_stack.num_layers,
        dtype=dtype,
    )
    return Plan(
        "revert",
        tensors,
        recipe,
        files_from=trained,
        inputs=[base, trained],
        dtype=dtype,
        mergekit_config=revert_config(base, trained, chosen_stack, indices, dtype, module_filter),
        shard_groups=[[t.name for t in shard.tensors] for shard in trained.shards],
    )
