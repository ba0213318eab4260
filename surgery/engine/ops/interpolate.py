"""interpolate: (1 - alpha) * BASE + alpha * TRAINED, per layer range if asked."""

from __future__ import annotations

import math

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
from surgery.engine.ops.merge.equivalent import interpolate_config
from surgery.engine.plan import (
    OutputTensor,
    Plan,
    Source,
    blend_of,
    check_compatible,
    copy_of,
    require_equal_non_float,
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
) -> tuple[LayerValues, Stack | None, ModuleFilter | None]:
    """Turn `--alpha` (a number or `9:28=0.3,*=1.0`) and `--layers` into values per layer.

    A bare number applies to every tensor, unless `layers` restricts it to those layers; tensors
    not covered come from TRAINED (alpha 1).

    `modules` narrows the layers to those tensors (see `surgery.core.modules`): the others get
    the `*` alpha, or TRAINED's. It needs per-range alphas or `layers`.

    Alphas outside [0, 1] extrapolate beyond BASE or TRAINED (task-vector extrapolation): allowed
    only with `extrapolate`, so a typo never silently writes an extrapolated model.

    Raises:
        LayerSpecError: a bad spec, per-range alphas combined with --layers, an alpha outside
            [0, 1] without `extrapolate`, or `modules` without layers or matching none.
    """
    text = str(alpha)
    per_range = "=" in text
    if per_range and layers is not None:
        raise LayerSpecError("give either per-range alphas (9:28=0.3,*=1) or --layers, not both")
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
        raise LayerSpecError(f"alpha {text!r} is not a finite number")
    outside = [
        v for v in [*values.per_layer.values(), values.default] if v is not None and not 0 <= v <= 1
    ]
    if outside and not extrapolate:
        raise LayerSpecError(
            f"alpha {outside[0]:g} lies outside [0, 1] (alpha {text!r}); pass --extrapolate to "
            "extrapolate beyond BASE or TRAINED on purpose"
        )
    return values, chosen, _module_filter(checkpoint, modules, values, chosen)


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
        return copy_of(base, dtype)
    if alpha == 1.0:
        return copy_of(trained, dtype)
    return blend_of([Source(base, 1.0 - alpha), Source(trained, alpha)], dtype or trained.dtype)


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
) -> Plan:
    """Plan (1 - a) * BASE + a * TRAINED with a per layer (see `resolve_alphas`).

    Non-float tensors are copied from TRAINED and must equal BASE's.

    Raises:
        MismatchError: the checkpoints do not line up.
        LayerSpecError: a bad alpha or layer spec.
    """
    check_compatible(
        [trained, base], ["trained", "base"], float_dtypes_may_differ=dtype is not None
    )
    values, chosen, module_filter = resolve_alphas(
        trained, alpha, layers, stack, extrapolate=extrapolate, modules=modules
    )
    alphas = {}
    for name in trained.tensors:
        layer = stack_layer(name, chosen, module_filter) if chosen is not None else None
        value = values.value_for(layer)
        alphas[name] = 1.0 if value is None else value
    blended = {name for name, value in alphas.items() if value not in (0.0, 1.0)}
    tensors = []
    with SourcePool(openers([base, trained])) as pool:
        labels = ["trained", "base"]
        scales = check_scales([trained, base], labels, pool, dtype=dtype, blended=blended)
        for name, tensor in trained.tensors.items():
            if not tensor.is_float:
                require_equal_non_float([tensor, base.tensors[name]], labels, pool)
                tensors.append(copy_of(tensor))
            elif name in scales and name in blended:  # identical in both (checked)
                tensors.append(copy_of(tensor))
            else:
                tensors.append(_blend(base.tensors[name], tensor, alphas[name], dtype))
    recipe = make_recipe(
        "interpolate",
        [("base", base), ("trained", trained)],
        alpha=str(alpha),
        layers=layers,
        stack=chosen.name if chosen is not None else None,
        modules=modules,
        dtype=dtype,
        extrapolate=extrapolate or None,
    )
    return Plan(
        "interpolate",
        tensors,
        recipe,
        files_from=trained,
        inputs=[base, trained],
        dtype=dtype,
        mergekit_config=interpolate_config(base, trained, values, chosen, dtype, module_filter),
    )
