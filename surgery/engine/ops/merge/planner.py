"""Turn a `MergeSpec` into a `Plan`: which input tensors feed each output tensor, with which
parameters, and the method's kernel for it.

A `models:` merge keeps every tensor name; the parameter gradient position `t` of a layer is
layer / (layers - 1) in its stack (0 outside stacks). A `slices:` merge renumbers the text stack's
layers slice after slice (t runs 0 to 1 within a slice); tensors outside the stack come from the
first slice's models when they are mergekit's "pre" weights (embeddings), from the last slice's
otherwise ("post" weights: final norm, head; see `architectures`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

from surgery.core.errors import MismatchError
from surgery.core.layers import Stack, select_stack, stack_layer
from surgery.engine.matching import Matching, match
from surgery.engine.naming import layout_of, vocab_rows
from surgery.engine.ops.merge import mergekit_arithmetic, registry
from surgery.engine.ops.merge.architectures import is_pre_weight
from surgery.engine.ops.merge.equivalent import with_local_paths
from surgery.engine.ops.merge.method import REQUIRED, Base, Method, Param, Scope, TensorJob
from surgery.engine.ops.merge.modules import check_modules, module_map
from surgery.engine.ops.merge.spec import (
    MergeConfigError,
    MergeSpec,
    ModuleSpec,
    OutputSlice,
    Setting,
    SliceSource,
    evaluate,
)
from surgery.engine.ops.merge.vocabulary import (
    VocabularyMap,
    common_float,
    is_vocabulary_tensor,
    permuted,
)
from surgery.engine.plan import OutputTensor, Plan, copy_of, require_equal_non_float
from surgery.engine.quantized import (
    refuse_cast,
    require_equal_scales,
    scale_of,
    scale_pairs,
    weight_of,
)
from surgery.engine.reader import Checkpoint, TensorInfo
from surgery.engine.recipe import make_recipe
from surgery.engine.source import SourcePool


@dataclass(frozen=True)
class _Tensor:
    """One output tensor to plan: its name, its inputs (a slice source each) and `t`."""

    name: str
    inputs: list[tuple[SliceSource, str]]  # (source, input tensor name)
    slice: OutputSlice
    t: float
    module: dict[str, Setting] = field(default_factory=dict)  # its module's parameters


def _label(spec: MergeSpec, model: int) -> str:
    return f"model {spec.models[model]}"


def check_parameters(spec: MergeSpec, method: Method) -> None:
    """Every parameter named anywhere must be one the method has.

    Raises:
        MergeConfigError: naming the unknown parameter and the method's parameters.
    """
    scopes: list[dict[str, Setting]] = [spec.parameters, *spec.model_parameters]
    scopes += [module.parameters for module in spec.modules or ()]
    for out_slice in _spec_slices(spec):
        scopes += [out_slice.parameters, *(s.parameters for s in out_slice.sources)]
    known = [p.name for p in method.params]
    for scope in scopes:
        for name in scope:
            if name not in known:
                raise MergeConfigError(
                    f"parameter {name!r} is not one of {method.name}'s "
                    f"({', '.join(known) or 'none'})"
                )


def _check_contract(method: Method, sources: Sequence[SliceSource], base: int | None) -> None:
    models = [s.model for s in sources]
    has_base = base is not None and base in models and method.base != Base.IGNORED
    if method.base == Base.REQUIRED and not has_base:
        raise MergeConfigError(f"{method.name} needs a base_model among its inputs")
    count, non_base = len(models), len(models) - int(has_base)
    if count < method.min_inputs or (method.max_inputs and count > method.max_inputs):
        most = f" and at most {method.max_inputs}" if method.max_inputs else ""
        raise MergeConfigError(
            f"{method.name} takes at least {method.min_inputs}{most} models; got {count}"
        )
    if method.non_base_count and not (
        method.non_base_count[0] <= non_base <= method.non_base_count[1]
    ):
        low, high = method.non_base_count
        count_text = f"exactly {low}" if low == high else f"at least {low}"
        raise MergeConfigError(
            f"{method.name} takes {count_text} models besides the base; got {non_base}"
        )


def _validate(param: Param, value: object, where: str) -> object:
    if value is None:
        return None
    try:
        if param.kind is bool:
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            if not isinstance(value, bool | int):
                raise ValueError
            return bool(value)
        if isinstance(value, bool):
            raise ValueError
        return param.kind(value)
    except (TypeError, ValueError):
        kind = param.kind.__name__
        raise MergeConfigError(f"{param.name} {value!r} ({where}) is not a {kind}") from None


def _resolve(
    param: Param, scopes: Sequence[dict[str, Setting]], tensor: str, t: float, where: str
) -> object:
    for scope in scopes:
        if param.name in scope:
            value = evaluate(scope[param.name], tensor, t)
            if value is not None:
                return _validate(param, value, where)
    if param.default is REQUIRED:
        raise MergeConfigError(f"missing parameter {param.name!r} for {where}")
    return param.default


def _text_stack(checkpoint: Checkpoint, label: str) -> Stack:
    stacks = checkpoint.stacks
    if len(stacks) != 1:
        found = ", ".join(s.name for s in stacks) or "none"
        raise MergeConfigError(
            f"slices need a model with one layer stack; {label} has {len(stacks)} ({found})"
        )
    return select_stack(stacks, None)


def _position(reference: Checkpoint, name: str) -> float:
    """A tensor's gradient position: layer / (layers - 1) in its stack, 0 outside stacks."""
    for stack in reference.stacks:
        layer = stack_layer(name, stack)
        if layer is not None:
            return layer / (stack.num_layers - 1) if stack.num_layers > 1 else 1.0
    return 0.0


def _full_model_tensors(matching: Matching, out_slice: OutputSlice) -> Iterator[_Tensor]:
    """Every tensor of the first model (the output's names), with each model's tensor of the
    same canonical name (models may name them in other layouts, see `matching`)."""
    reference = matching.checkpoints[0]
    for name in reference.tensors:
        inputs = [(s, matching.partner(name, s.model).name) for s in out_slice.sources]
        yield _Tensor(name, inputs, out_slice, _position(reference, name))


def _module_slices(spec: MergeSpec, module: ModuleSpec) -> tuple[OutputSlice, ...]:
    """A module's slices: its own `slices:`, or a `models:` module's one slice with the base
    among its sources, as mergekit adds it."""
    if module.sliced:
        return module.slices
    out_slice = module.slices[0]
    if spec.base is None or spec.base in [s.model for s in out_slice.sources]:
        return (out_slice,)
    return (replace(out_slice, sources=(*out_slice.sources, SliceSource(spec.base, 0, 0))),)


def _check_module_sources(
    spec: MergeSpec, checkpoints: Sequence[Checkpoint], reference: int
) -> dict[str, str]:
    """Refuse a module the reference lacks or leaves out, and a model without a tensor of its
    module (a text-only model named for a vision tower), before any matching note is shown.
    Returns the reference's tensor -> module."""
    tensors = checkpoints[reference].tensors
    layout = layout_of(tensors)
    found = module_map(tensors, layout)
    check_modules(spec.modules, found, _label(spec, reference))
    for module in spec.modules:
        names = [n for n, m in found.items() if m == module.name]
        if module.sliced:  # its layers are checked slice by slice, as `slices:` are
            stack = _module_stack(checkpoints[reference], names)
            names = [n for n in names if stack is None or stack_layer(n, stack) is None]
        wanted = [layout.canonical[n] for n in names]
        for source in (s for sl in _module_slices(spec, module) for s in sl.sources):
            canonical = layout_of(checkpoints[source.model].tensors).canonical.values()
            missing = set(wanted) - set(canonical)
            if missing:
                first = next(n for n in wanted if n in missing)
                raise MismatchError(
                    f"{_label(spec, source.model)} has no {first!r} (module {module.name})"
                )
    return found


def _module_tensors(
    spec: MergeSpec, checkpoints: Sequence[Checkpoint]
) -> tuple[Matching, list[int], list[_Tensor], dict]:
    """Every tensor of the output's reference (the base, else the first model), module by
    module in the config's order, with the tensor of the same canonical name of each model its
    module names (a `slices:` module's layers renumbered as `slices:` renumber them). Returns
    the matching (the reference first) with the models in its order, the tensors, and the
    config.json keys that sliced modules change (their layer counts)."""
    reference = spec.base if spec.base is not None else 0
    found = _check_module_sources(spec, checkpoints, reference)
    order = [reference, *(i for i in range(len(checkpoints)) if i != reference)]
    matching = match(
        [checkpoints[i] for i in order],
        [_label(spec, i) for i in order],
        float_dtypes_may_differ=True,
        lonely="each comes from the models its module names",
    )
    where = {model: position for position, model in enumerate(order)}

    def partner(name: str, model: int) -> str:
        return matching.partner(name, where[model]).name

    items, updates = [], {}
    for module in spec.modules:
        names = [n for n, m in found.items() if m == module.name]
        if module.sliced:
            items += _sliced_module(spec, checkpoints, reference, module, names, partner)
            stack = _module_stack(checkpoints[reference], names)
            if stack is not None:
                count = sum(s.num_layers for s in module.slices)
                updates |= _layer_count(checkpoints[reference].config, stack, count)
            continue
        (out_slice,) = _module_slices(spec, module)
        for name in names:
            inputs = [(s, partner(name, s.model)) for s in out_slice.sources]
            t = _position(checkpoints[reference], name)
            items.append(_Tensor(name, inputs, out_slice, t, module.parameters))
    return matching, order, items, updates


def _module_stack(checkpoint: Checkpoint, names: Sequence[str]) -> Stack | None:
    """The layer stack of a module (of tensors `names`), which its `slices:` count layers of;
    None for a module without layers (a projector)."""
    for stack in checkpoint.stacks:
        if any(stack_layer(name, stack) is not None for name in names):
            return stack
    return None


def _sliced_module(
    spec: MergeSpec,
    ckpts: Sequence[Checkpoint],
    reference: int,
    module: ModuleSpec,
    names: Sequence[str],
    partner: Callable[[str, int], str],
) -> list[_Tensor]:
    """A `slices:` module's tensors, as mergekit plans them: its "pre" weights from the first
    slice's models, its stack's layers slice after slice, its other weights from the last's.
    A module without layers has only "pre" weights (as mergekit's projectors), from the first
    slice, whose layer ranges must then be empty."""
    stack = _module_stack(ckpts[reference], names)
    first, last = module.slices[0], module.slices[-1]

    def outer(name: str, out_slice: OutputSlice, sources: Sequence[SliceSource]) -> _Tensor:
        inputs = [(s, partner(name, s.model)) for s in sources]
        return _Tensor(name, inputs, out_slice, 0.0, module.parameters)

    if stack is None:
        ranges = [s for out_slice in module.slices for s in out_slice.sources if s.stop > s.start]
        if ranges:
            raise MergeConfigError(
                f"modules.{module.name}: layer_range [{ranges[0].start}, {ranges[0].stop}] "
                "of a module without layers (give [0, 0])"
            )
        return [outer(n, first, first.sources) for n in names]
    stacks = {}
    for model in (m for out_slice in module.slices for m in _models(out_slice)):
        found = [s for s in ckpts[model].stacks if s.prefix == stack.prefix]
        if not found:
            raise MismatchError(
                f"{_label(spec, model)} has no layers {stack.prefix}.N (module {module.name})"
            )
        stacks[model] = found[0]
    canonical = layout_of(ckpts[reference].tensors).canonical
    outside = [n for n in names if stack_layer(n, stack) is None]
    layers = _slice_layers(ckpts, stacks, module.slices, stack.prefix)
    post = _post_sources(module.slices)
    return (
        [outer(n, first, first.sources) for n in outside if is_pre_weight(canonical[n])]
        + [replace(item, module=module.parameters) for item in layers]
        + [outer(n, last, post) for n in outside if not is_pre_weight(canonical[n])]
    )


# The config.json section that holds a stack's layer count (mergekit's `num_layers_config_key`
# of its module), by the stack's kind; a text stack's count is top-level in a text-only config.
_LAYER_SECTIONS = {"text": "text_config", "vision": "vision_config", "audio": "audio_config"}


def _layer_count(config: dict, stack: Stack, count: int) -> dict:
    """The config.json keys to set for `count` output layers of `stack`."""
    section = _LAYER_SECTIONS.get(stack.name)
    if isinstance(config.get(section), dict):
        return {section: {**config[section], "num_hidden_layers": count}}
    return {"num_hidden_layers": count} if stack.name == "text" else {}


def _sliced_tensors(
    spec: MergeSpec, ckpts: Sequence[Checkpoint], slices: Sequence[OutputSlice]
) -> Iterator[_Tensor]:
    stacks = {m: _text_stack(ckpts[m], _label(spec, m)) for s in slices for m in _models(s)}
    first, last = slices[0], slices[-1]
    reference = ckpts[first.sources[0].model]
    outside = [n for n in reference.tensors if not _in(n, stacks)]
    for name in outside:
        if is_pre_weight(name):
            yield _Tensor(name, [(s, name) for s in first.sources], first, 0.0)
    yield from _slice_layers(ckpts, stacks, slices, stacks[first.sources[0].model].prefix)
    for name in outside:
        if not is_pre_weight(name):
            yield _Tensor(name, [(s, name) for s in _post_sources(slices)], last, 0.0)


def _post_sources(slices: Sequence[OutputSlice]) -> tuple[SliceSource, ...]:
    """The sources of the weights after the stack: the last slice's, as many as the first slice
    has (mergekit pairs the last slice's models with the first slice's count of weights, and
    `zip` drops the rest)."""
    return slices[-1].sources[: len(slices[0].sources)]


def _slice_layers(
    ckpts: Sequence[Checkpoint],
    stacks: dict[int, Stack],
    slices: Sequence[OutputSlice],
    out_prefix: str,
) -> Iterator[_Tensor]:
    """The layers of `slices` (each model's in its stack of `stacks`), numbered from 0 under
    `out_prefix`; t runs from 0 to 1 within each slice."""
    out_layer = 0
    for out_slice in slices:
        lengths = {s.stop - s.start for s in out_slice.sources}
        if len(lengths) != 1:
            raise MergeConfigError("every source of a slice must have the same number of layers")
        for offset in range(out_slice.num_layers):
            t = offset / (out_slice.num_layers - 1) if out_slice.num_layers > 1 else 1.0
            ref_source = out_slice.sources[0]
            for suffix in _layer_suffixes(ckpts, stacks, ref_source, ref_source.start + offset):
                inputs = []
                for source in out_slice.sources:
                    prefix = stacks[source.model].prefix
                    inputs.append((source, f"{prefix}.{source.start + offset}.{suffix}"))
                name = f"{out_prefix}.{out_layer}.{suffix}"
                yield _Tensor(name, inputs, out_slice, t)
            out_layer += 1


def _models(out_slice: OutputSlice) -> list[int]:
    models = [s.model for s in out_slice.sources]
    return models + ([out_slice.base] if out_slice.base is not None else [])


def _in(name: str, stacks: dict[int, Stack]) -> bool:
    return any(stack_layer(name, s) is not None for s in stacks.values())


def _layer_suffixes(ckpts, stacks, source: SliceSource, layer: int) -> list[str]:
    stack = stacks[source.model]
    if not 0 <= layer < stack.num_layers:
        raise MergeConfigError(
            f"layer_range [{source.start}, {source.stop}] is outside the {stack.num_layers} "
            "layers of its model"
        )
    head = f"{stack.prefix}.{layer}."
    return [n[len(head) :] for n in ckpts[source.model].tensors if n.startswith(head)]


def _input(ckpts, spec: MergeSpec, source: SliceSource, name: str) -> TensorInfo:
    tensor = ckpts[source.model].tensors.get(name)
    if tensor is None:
        raise MismatchError(f"{name!r} is missing from {_label(spec, source.model)}")
    return tensor


def _out_dtype(spec: MergeSpec, inputs: Sequence[TensorInfo]) -> str:
    if spec.out_dtype or spec.dtype:
        return spec.out_dtype or spec.dtype
    dtypes = {t.dtype for t in inputs}
    if len(dtypes) == 1:
        return dtypes.pop()
    return "F64" if "F64" in dtypes else "F32"


class _Planner:
    def __init__(
        self,
        spec: MergeSpec,
        ckpts: Sequence[Checkpoint],
        pool: SourcePool,
        vocabulary: VocabularyMap | None = None,
    ) -> None:
        self.spec, self.ckpts, self.pool = spec, ckpts, pool
        self.vocabulary = vocabulary
        self.method = registry.get(spec.method)
        self.build = self.method.build
        if spec.mergekit_arithmetic:
            self.build = partial(
                mergekit_arithmetic.build, method=spec.method, config_dtype=spec.dtype
            )

    def tensor(self, item: _Tensor) -> OutputTensor:
        spec, method = self.spec, self.method
        base = item.slice.base if item.slice.base is not None else spec.base
        infos = [_input(self.ckpts, spec, s, n) for s, n in item.inputs]
        infos = self._on_vocabulary(item, infos)
        shapes = {t.shape for t in infos}
        if len(shapes) != 1:
            raise MismatchError(f"{item.name!r} has different shapes in the inputs: {shapes}")
        labels = [_label(spec, s.model) for s, _ in item.inputs]
        if not all(t.is_float for t in infos):
            require_equal_non_float(infos, labels, self.pool)
            return replace(copy_of(infos[0]), name=item.name)
        if len(item.inputs) > 1 and self._check_scales(item, infos, labels):
            return replace(copy_of(infos[0]), name=item.name)
        models = [s.model for s, _ in item.inputs]
        base_index = models.index(base) if base in models and method.base != Base.IGNORED else None
        shared_scopes = [item.slice.parameters, item.module, spec.parameters]
        shared = {
            p.name: _resolve(p, shared_scopes, item.name, item.t, item.name)
            for p in method.params
            if p.scope == Scope.SHARED
        }
        per_input = []
        for position, (source, name) in enumerate(item.inputs):
            scopes = [source.parameters, item.slice.parameters, item.module, spec.parameters]
            where = f"{_label(spec, source.model)}, tensor {name}"
            per_input.append(
                {
                    p.name: _resolve(p, scopes, name, item.t, where)
                    for p in method.params
                    if p.scope == Scope.INPUT
                    or (p.scope == Scope.NON_BASE and position != base_index)
                }
            )
        job = TensorJob(
            name=item.name,
            shape=infos[0].shape,
            out_dtype=_out_dtype(spec, infos),
            inputs=infos,
            base=base_index,
            shared=shared,
            per_input=per_input,
            seed=spec.seed,
        )
        return replace(self.build(job), name=item.name)

    def _on_vocabulary(self, item: _Tensor, infos: list[TensorInfo]) -> list[TensorInfo]:
        """The inputs of a vocabulary tensor permuted onto the output vocabulary (when the merge
        has one, see `vocabulary`); other tensors' inputs as they are."""
        if self.vocabulary is None:
            return infos
        models = [s.model for s, _ in item.inputs]
        if not all(
            is_vocabulary_tensor(t, vocab_rows(self.ckpts[m].config))
            for t, m in zip(infos, models, strict=True)
        ):
            return infos
        columns: list[TensorInfo | None] = [None] * len(self.ckpts)
        for model, info in zip(models, infos, strict=True):
            columns[model] = info
        dtype = self.spec.dtype or common_float({t.dtype for t in infos})
        return [permuted(m, columns, self.vocabulary, dtype) for m in models]

    def _check_scales(
        self, item: _Tensor, infos: Sequence[TensorInfo], labels: Sequence[str]
    ) -> bool:
        """FP8 weights blended with their scales (see `quantized`): the scales of a blended
        weight must be identical in every input. Returns whether `item` is such a scale, which
        is then copied, never blended."""
        models = [self.ckpts[s.model] for s, _ in item.inputs]
        names = [n for _, n in item.inputs]
        weight = weight_of(models[0], names[0])
        if weight is not None:
            require_equal_scales(weight, infos, labels, self.pool)
            return True
        scales = [scale_of(m, n) for m, n in zip(models, names, strict=True)]
        if scales[0] is not None:
            missing = [label for label, x in zip(labels, scales, strict=True) if x is None]
            if missing:
                raise MismatchError(f"FP8 weight {item.name!r} has no scale in {missing[0]}")
            found = [m.tensors[x] for m, x in zip(models, scales, strict=True)]
            require_equal_scales(item.name, found, labels, self.pool)
        return False


def check_spec(spec: MergeSpec) -> None:
    """What can be checked before any model is opened: the method, its parameters, the mode,
    each slice's (or module's) input contract. A multi-stage merge checks every stage so.

    Raises:
        MergeConfigError: an unknown method or parameter, or a method's input contract broken.
    """
    method = registry.get(spec.method)
    check_parameters(spec, method)
    if spec.mergekit_arithmetic:
        mergekit_arithmetic.check_method(spec.method)
    for out_slice in _spec_slices(spec):
        base = out_slice.base if out_slice.base is not None else spec.base
        _check_contract(method, out_slice.sources, base)


def _spec_slices(spec: MergeSpec) -> tuple[OutputSlice, ...]:
    """The slices a merge plans: its `slices:`, each module's, or one of every model."""
    if spec.modules is not None:
        return tuple(s for module in spec.modules for s in _module_slices(spec, module))
    if spec.slices is not None:
        return spec.slices
    models = list(range(len(spec.models)))
    return (OutputSlice(tuple(SliceSource(i, 0, 0, spec.model_parameters[i]) for i in models)),)


def plan_merge(
    spec: MergeSpec, checkpoints: Sequence[Checkpoint], vocabulary: VocabularyMap | None = None
) -> Plan:
    """Plan a merge of `checkpoints` (opened from `spec.models`, in that order).

    `vocabulary` (built from the tokenizers above the engine) lays every model's embedding and
    head rows out on the output vocabulary before the method blends them.

    Raises:
        MergeConfigError: an unknown method or parameter, a method's input contract broken,
            impossible layer ranges or parameter values.
        MismatchError: the models do not line up.
    """
    check_spec(spec)
    for checkpoint in checkpoints:
        refuse_cast(scale_pairs(checkpoint), spec.out_dtype or spec.dtype)
    slices = _spec_slices(spec)
    matching, order, updates = None, list(range(len(checkpoints))), {}
    if spec.modules is not None:
        matching, order, items, updates = _module_tensors(spec, checkpoints)
    elif spec.slices is None:
        labels = [_label(spec, i) for i in range(len(checkpoints))]
        matching = match(
            checkpoints,
            labels,
            float_dtypes_may_differ=True,
            vocabulary=vocabulary is not None,
            vocabulary_hint="set tokenizer_source (union, base or a model)",
        )
        items = _full_model_tensors(matching, slices[0])
    else:
        items = _sliced_tensors(spec, checkpoints, slices)
    with SourcePool() as pool:
        planner = _Planner(spec, checkpoints, pool, vocabulary)
        tensors = [planner.tensor(item) for item in items]
    donor = checkpoints[spec.base if spec.base is not None else 0]
    if spec.slices is not None:
        updates["num_hidden_layers"] = sum(s.num_layers for s in spec.slices)
    if vocabulary is not None:
        updates["vocab_size"] = vocabulary.size
    config = with_local_paths(spec.config, spec.models, checkpoints)
    # The base model is named so (a card then says which input it is); the seed only where
    # the method draws random masks (a TIES card must not speak of masks it has none of).
    roles = ["base" if i == spec.base else f"model{i + 1}" for i in range(len(checkpoints))]
    recipe = make_recipe(
        "merge",
        list(zip(roles, checkpoints, strict=True)),
        method=spec.method,
        seed=spec.seed if registry.get(spec.method).random else None,
        mergekit_arithmetic=spec.mergekit_arithmetic or None,
        config=config,
        matching=matching.record([roles[i] for i in order]) if matching is not None else None,
        tokenizer=vocabulary.record if vocabulary is not None else None,
    )
    return Plan(
        "merge",
        tensors,
        recipe,
        files_from=donor,
        inputs=list(checkpoints),
        dtype=spec.out_dtype or spec.dtype,
        config_updates=updates,
        mergekit_config=config,
    )
