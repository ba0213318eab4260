"""interpolate: (1 - alpha) * BASE + alpha * TRAINED, per layer range if asked."""

from __future__ import annotations

import math
from functools import partial

from surgery.core.errors import LayerSpecError
from surgery.core.layers import (
    LayerValues,
    Stack,
    parse_layer_spec,
    parse_layer_values,
    require_modules,
    select_stack,
    stack_layer,
)
from surgery.core.modules import ModuleFilter, parse_module_filter
from surgery.engine.matching import match
from surgery.engine.ops.merge.equivalent import interpolate_config
from surgery.engine.plan import (
    OutputTensor,
    Plan,
    Source,
    blend_of,
    copy_of,
    joined,
    require_equal_non_float,
    trained_plan,
)
from surgery.engine.quantized import check_scales
from surgery.engine.reader import Checkpoint, TensorInfo, openers
from surgery.engine.recipe import make_recipe
from surgery.engine.source import SourcePool


def resolve_alphas(
    checkpoint: Checkpoint,
    alpha: str | float,
    layers: str | None,
    stack: str | None,
    *,
    extrapolate: bool = False,
    modules: str | None = None,
    beta: bool = False,
) -> tuple[LayerValues, Stack | None, ModuleFilter | None]:
    """Turn `--alpha` (a number or `9:28=0.3,*=1.0`) and `--layers` into values per layer.

    A bare number applies to every tensor, unless `layers` restricts it to those layers; tensors
    not covered come from TRAINED (alpha 1).

    `modules` narrows the layers to those tensors (see `surgery.core.modules`): the others get
    the `*` alpha, or TRAINED's. It needs per-range alphas or `layers`.

    Alphas outside [0, 1] extrapolate beyond BASE or TRAINED (task-vector extrapolation): allowed
    only with `extrapolate`, so a typo never silently writes an extrapolated model.

    With `beta`, the numbers given are BASE's share (a donor's, in the paper's grafts:
    TRAINED + beta * (BASE - TRAINED)), and each alpha is 1 - beta; tensors not covered still
    come from TRAINED (beta 0).

    Raises:
        LayerSpecError: a bad spec, per-range alphas combined with --layers, an alpha outside
            [0, 1] without `extrapolate`, or `modules` without layers or matching none.
    """
    word = "beta" if beta else "alpha"
    text = str(alpha)
    per_range = "=" in text
    if per_range and layers is not None:
        raise LayerSpecError(f"give either per-range {word}s (9:28=0.3,*=1) or --layers, not both")
    chosen = None if not per_range and layers is None else select_stack(checkpoint.stacks, stack)
    if chosen is None:
        values = parse_layer_values(text, 1)
    elif per_range:
        values = parse_layer_values(text, chosen.num_layers)
    else:
        value = parse_layer_values(text, 1).default
        values = LayerValues(
            per_layer=dict.fromkeys(parse_layer_spec(layers, chosen.num_layers), value)
        )
    if not all(
        math.isfinite(v) for v in [*values.per_layer.values(), values.default] if v is not None
    ):
        raise LayerSpecError(f"{word} {text!r} is not a finite number")
    outside = [
        v for v in [*values.per_layer.values(), values.default] if v is not None and not 0 <= v <= 1
    ]
    if outside and not extrapolate:
        raise LayerSpecError(
            f"{word} {outside[0]:g} lies outside [0, 1] ({word} {text!r}); pass --extrapolate to "
            "extrapolate beyond BASE or TRAINED on purpose"
        )
    if beta:
        values = alphas_of_betas(values)
    return values, chosen, _module_filter(checkpoint, modules, values, chosen)


def alphas_of_betas(values: LayerValues) -> LayerValues:
    """Betas (BASE's share) as alphas (TRAINED's share): alpha = 1 - beta, per layer and for
    `*`; what no value covers stays uncovered (TRAINED's)."""
    return LayerValues(
        per_layer={layer: 1.0 - beta for layer, beta in values.per_layer.items()},
        default=None if values.default is None else 1.0 - values.default,
    )


def _module_filter(
    checkpoint: Checkpoint, modules: str | None, values: LayerValues, chosen: Stack | None
) -> ModuleFilter | None:
    """The parsed `--modules`, checked against the tensors of the layers it narrows."""
    if modules is None:
        return None
    if chosen is None or not values.per_layer:
        raise LayerSpecError("--modules narrows layers: give --layers or per-range alphas")
    module_filter = parse_module_filter(modules)
    require_modules(module_filter, checkpoint.tensors, chosen, values.per_layer)
    return module_filter


def _blend(base: TensorInfo, trained: TensorInfo, alpha: float, dtype: str | None) -> OutputTensor:
    # Exact endpoints: alpha 0 and 1 are byte copies, bit-identical to the input.
    if alpha == 0.0:
        return copy_of(base, dtype, name=trained.name)
    if alpha == 1.0:
        return copy_of(trained, dtype)
    sources = [Source(base, 1.0 - alpha), Source(trained, alpha)]
    return blend_of(sources, dtype or trained.dtype, name=trained.name)


def blend_rows(
    base: TensorInfo, trained: TensorInfo, alpha: float, dtype: str | None
) -> OutputTensor:
    """`_blend` of the rows both tensors have; TRAINED's own rows after them (a vocabulary that
    grew in training), so the output has TRAINED's shape."""
    if alpha == 1.0 or base.shape == trained.shape:
        return _blend(base, trained, alpha, dtype)
    shared = min(base.shape[0], trained.shape[0])
    pieces = [_blend(base.rows(0, shared), trained.rows(0, shared), alpha, dtype)]
    if shared < trained.shape[0]:
        pieces.append(copy_of(trained.rows(shared, trained.shape[0]), pieces[0].dtype))
    return joined(trained.name, trained.shape, pieces)


# What an interpolation does with tensors without counterpart and rows of a grown vocabulary.
LONELY = (
    "the output keeps trained's layout; tensors without counterpart and rows only trained has "
    "come from trained, the rows both have are blended"
)


def plan_interpolate(
    base: Checkpoint,
    trained: Checkpoint,
    alpha: str | float,
    *,
    layers: str | None = None,
    stack: str | None = None,
    dtype: str | None = None,
    extrapolate: bool = False,
    modules: str | None = None,
    beta: str | None = None,
    base_role: str = "base",
    trained_base: str | None = None,
) -> Plan:
    """Plan (1 - a) * BASE + a * TRAINED with a per layer (see `resolve_alphas`).

    BASE's tensors are matched to TRAINED's by name across layouts (`surgery.engine.matching`);
    the output keeps TRAINED's layout, and its tensors without a counterpart in BASE (a vision
    tower) come from TRAINED. Where the vocabulary grew, the rows both have are blended and the
    added rows come from TRAINED. Non-float tensors are copied from TRAINED and must equal
    BASE's.

    `beta` (instead of `alpha`, which is then ignored) gives BASE's share, as the paper's
    donor grafts do: TRAINED + beta * (BASE - TRAINED), alpha = 1 - beta. `base_role` names
    BASE's role in the recipe ("donor" when it is not TRAINED's base); `trained_base` is the
    base TRAINED names, when it names one.

    Raises:
        MismatchError: the checkpoints do not line up.
        LayerSpecError: a bad alpha or layer spec.
    """
    labels = ["trained", base_role]
    matching = match(
        [trained, base],
        labels,
        float_dtypes_may_differ=dtype is not None,
        vocabulary=True,
        lonely=LONELY,
    )
    values, chosen, module_filter = resolve_alphas(
        trained,
        alpha if beta is None else beta,
        layers,
        stack,
        extrapolate=extrapolate,
        modules=modules,
        beta=beta is not None,
    )
    alphas = {}
    for name in trained.tensors:
        layer = stack_layer(name, chosen, module_filter) if chosen is not None else None
        value = values.value_for(layer)
        alphas[name] = 1.0 if value is None else value
    blended = {name for name, value in alphas.items() if value not in (0.0, 1.0)}
    tensors = []
    with SourcePool(openers([base, trained])) as pool:
        scales = check_scales(matching, labels, pool, dtype=dtype, blended=blended)
        for name, tensor in trained.tensors.items():
            theirs = matching.partner(name, 1)
            if theirs is None:  # outside the text model, only in TRAINED
                tensors.append(copy_of(tensor, dtype))
            elif not tensor.is_float:
                require_equal_non_float([tensor, theirs], labels, pool)
                tensors.append(copy_of(tensor))
            elif name in scales and name in blended:  # identical in both (checked)
                tensors.append(copy_of(tensor))
            else:
                tensors.append(blend_rows(theirs, tensor, alphas[name], dtype))
    recipe = make_recipe(
        "interpolate",
        [(base_role, base), ("trained", trained)],
        alpha=str(alpha) if beta is None else None,
        beta=beta,
        layers=layers,
        stack=chosen.name if chosen is not None else None,
        modules=modules,
        dtype=dtype,
        extrapolate=extrapolate or None,
        matching=matching.record(labels),
        trained_base=trained_base,
    )
    mergekit = partial(interpolate_config, base, trained, values, chosen, dtype, module_filter)
    return trained_plan(
        "interpolate", tensors, recipe, base, trained, dtype, mergekit if matching.exact else None
    )
