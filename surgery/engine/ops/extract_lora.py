"""extract-lora: a PEFT LoRA adapter from the SVD of each weight's change TRAINED - BASE.

What goes where follows mergekit-extract-lora (0.1.5), whose options these are:
- every 2-D `.weight` of a module becomes `lora_A`/`lora_B` (rank at most `rank`, fewer where
  `sv_epsilon` discards singular values), a changed bias of such a module `lora_B.bias`;
- input embeddings and the output head are saved whole (`modules_to_save`) unless
  `embed_lora`: then the embeddings become `lora_embedding_A`/`lora_embedding_B` (the change
  transposed, as peft's `Embedding` layer holds them) and the head an ordinary LoRA;
- modules named in `save_modules` (a full module name or its last part) are saved whole;
- `include`/`exclude` regexes (searched in the module's name) narrow what is factored; other
  modules (norms: no 2-D weight) are saved whole unless `skip_undecomposable`.
The layer specs and module filter of the other commands narrow all of it to those layers.

Tensors are classified by name, without transformers: a module's last name part `lm_head` or
`embed_out` is a head, one containing `embed` (`embed_tokens`, `word_embeddings`) or GPT-2's
`wte`/`wpe` an input embedding.

Memory is one weight at a time: the writer calls the kernels below as it reaches each `lora_A`,
which decodes BASE's and TRAINED's weight, factors the change and hands `lora_B` to the next
job (see `surgery.engine.lowrank`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from surgery.core.dtypes import itemsize, torch_dtype
from surgery.core.errors import LayerSpecError, SurgeryError
from surgery.core.layers import (
    format_layers,
    parse_layer_spec,
    require_modules,
    select_stack,
    stack_layer,
)
from surgery.core.modules import parse_module_filter
from surgery.engine.lowrank import SOLVERS, Solver, factor, kept_rank, singular_values
from surgery.engine.plan import OutputTensor, Plan, Source, blend_of, check_compatible, copy_of
from surgery.engine.reader import Checkpoint, TensorInfo, openers
from surgery.engine.recipe import make_recipe
from surgery.engine.source import SourcePool
from surgery.engine.values import BLOCK_BYTES, tensor_values

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
_HEADS = ("lm_head", "embed_out")
# Architectures whose linear weights are stored transposed (transformers' Conv1D): their
# factors would need peft's fan_in_fan_out, which names alone cannot tell.
_TRANSPOSED = ("gpt2",)


@functools.cache
def _factoring_thread() -> ThreadPoolExecutor:
    """The one thread that decodes BASE's and TRAINED's weights and factors their change: one
    weight at a time in the process (that working set is the command's memory; LAPACK uses every
    core for it anyway, and the randomized solver seeds torch's global generator), and in one
    malloc arena, so the writer's other threads never each keep a weight's worth of freed heap."""
    return ThreadPoolExecutor(1, thread_name_prefix="extract-lora")


def _on_factoring_thread(function: Callable[..., T], *args: object) -> T:
    return _factoring_thread().submit(function, *args).result()


@dataclass(frozen=True)
class LoraOptions:
    """mergekit-extract-lora's options (its defaults), and the solver."""

    rank: int = 128
    sv_epsilon: float = 0.0
    embed_lora: bool = False
    save_modules: tuple[str, ...] = ()
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    skip_undecomposable: bool = False
    solver: Solver = dataclasses.field(default_factory=Solver)


@dataclass(frozen=True)
class _Module:
    """A module to factor: its name, BASE's and TRAINED's weight, whether it is an embedding."""

    name: str
    base: TensorInfo
    trained: TensorInfo
    embedding: bool

    @property
    def shape(self) -> tuple[int, int]:
        """The shape of the matrix factored (an embedding's transposed, as peft holds it)."""
        rows, cols = self.trained.shape
        return (cols, rows) if self.embedding else (rows, cols)


def _module_of(name: str) -> tuple[str, str]:
    """(module, parameter) of a tensor name: `a.b.weight` -> (`a.b`, `weight`)."""
    module, _, parameter = name.rpartition(".")
    return module, parameter


def _last(module: str) -> str:
    return module.rsplit(".", 1)[-1]


def is_head(module: str) -> bool:
    """Whether a module is the output head (a Linear, but saved whole like the embeddings)."""
    return _last(module) in _HEADS


def is_embedding(module: str) -> bool:
    """Whether a module is an input embedding table (by its name's last part)."""
    last = _last(module)
    return not is_head(module) and ("embed" in last or last in ("wte", "wpe"))


def _search(patterns: Sequence[str], module: str) -> bool:
    return any(re.search(p, module) for p in patterns)


def _decode(pool: SourcePool, info: TensorInfo) -> torch.Tensor:
    """`info`'s values as float32, read block by block (a Hub file by ranges)."""
    import torch

    values = tensor_values(pool.get(info.file), info)
    out = torch.empty(info.numel, dtype=torch.float32)
    step = max(1, BLOCK_BYTES // itemsize(info.dtype))
    for start in range(0, info.numel, step):
        out[start : start + step] = values[start : min(start + step, info.numel)]
    return out.view(info.shape)


def _delta(pool: SourcePool, module: _Module) -> torch.Tensor:
    """TRAINED - BASE of the module's weight in float32, transposed for an embedding.

    Raises:
        SurgeryError: a non-finite value (the SVD has no answer for it).
    """
    import torch

    delta = _decode(pool, module.trained)
    delta -= _decode(pool, module.base)
    if not bool(torch.isfinite(delta).all()):
        raise SurgeryError(f"{module.trained.name}: BASE or TRAINED has non-finite values")
    return delta.T if module.embedding else delta


def _factor(
    pool: SourcePool, module: _Module, rank: int, sketch_rank: int, solver: Solver
) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) of the module's change (see `surgery.engine.lowrank.factor`)."""
    return factor(_delta(pool, module), rank, solver, module.trained.name, sketch_rank)


def _values(pool: SourcePool, module: _Module, rank: int, solver: Solver) -> torch.Tensor:
    """The singular values of the module's change the solver sees."""
    return singular_values(_delta(pool, module), rank, solver, module.trained.name)


class _Factors:
    """The (A, B) of one module, computed once when its A is written and dropped once its B is
    (the writer writes them one after the other)."""

    def __init__(self, module: _Module, rank: int, sketch_rank: int, solver: Solver) -> None:
        self.module, self.rank, self.solver = module, rank, solver
        self.sketch_rank = sketch_rank  # the rank `_ranks` drew its sketch for
        self._lock = threading.Lock()
        self._result: list[torch.Tensor | None] | None = None

    def take(self, pool: SourcePool, index: int) -> torch.Tensor:
        """Factor `index` (0: A, 1: B), computing both on first use."""
        with self._lock:
            if self._result is None:
                factors = _on_factoring_thread(
                    _factor, pool, self.module, self.rank, self.sketch_rank, self.solver
                )
                self._result = list(factors)
            values, self._result[index] = self._result[index], None
            if values is None:  # a bug: each factor is written once
                raise RuntimeError(f"factor {index} of {self.module.name} taken twice")
            return values


class FactorKernel:
    """The writer's kernel of one factor (see `surgery.engine.ops.merge.kernel.Kernel` for the
    interface): writes factor `index` of `factors`, rounded once to `out_dtype`."""

    segmentable = False
    reduces = False

    def __init__(self, factors: _Factors, index: int, out_dtype: str) -> None:
        self.factors, self.index, self.out_dtype = factors, index, out_dtype
        module = factors.module
        # Only A reads the inputs (B comes from the same factorization): announced once.
        self.inputs = (module.base, module.trained) if index == 0 else ()

    def write(
        self,
        pool: SourcePool,
        fd: int,
        offset: int,
        progress: object,
        hasher: object,
        part: range | None = None,
        state: object = None,
    ) -> None:
        """Compute (or take) the factor and write it at byte `offset` of the shard `fd`."""
        import torch

        values = self.factors.take(pool, self.index).to(torch_dtype(self.out_dtype))
        if not bool(torch.isfinite(values).all()):
            raise SurgeryError(f"a factor of {self.factors.module.name} overflows {self.out_dtype}")
        # Flattened first: a column of U (rank 1) may be "contiguous" with a stride of its rows.
        data = memoryview(values.contiguous().reshape(-1).view(torch.uint8).numpy())
        hasher.add(offset, data)
        total = len(data)
        while len(data):
            written = os.pwrite(fd, data, offset)
            data, offset = data[written:], offset + written
        progress.update(total)


def _factor_tensors(module: _Module, rank: int, options: LoraOptions) -> list[OutputTensor]:
    """The output tensors `lora_A`, `lora_B` (or `lora_embedding_*`) of one module."""
    factors = _Factors(module, rank, _sketch_rank(module, options), options.solver)
    rows, cols = module.shape
    names = ("lora_embedding_A", "lora_embedding_B") if module.embedding else ("lora_A", "lora_B")
    suffix = "" if module.embedding else ".weight"
    sources = (Source(module.base), Source(module.trained))
    return [
        OutputTensor(
            f"{PREFIX}{module.name}.{names[index]}{suffix}",
            module.trained.dtype,
            shape,
            sources,
            kernel=FactorKernel(factors, index, module.trained.dtype),
        )
        for index, shape in enumerate([(rank, cols), (rows, rank)])
    ]


@dataclass
class _Selection:
    """Which modules are factored, which tensors saved whole."""

    factored: list[_Module] = dataclasses.field(default_factory=list)
    biases: list[tuple[TensorInfo, TensorInfo]] = dataclasses.field(default_factory=list)
    whole: list[tuple[str, TensorInfo]] = dataclasses.field(default_factory=list)  # (name, tensor)
    whole_modules: list[str] = dataclasses.field(default_factory=list)
    tied_head: bool = False  # the head is the input embedding (tie_word_embeddings)


def _classify(
    base: Checkpoint, trained: Checkpoint, options: LoraOptions, selected: set[str] | None
) -> _Selection:
    """Sort TRAINED's float tensors (of the `selected` names, if given) as mergekit does."""
    modules: dict[str, list[TensorInfo]] = {}
    for name, tensor in trained.tensors.items():
        if tensor.is_float and (selected is None or name in selected):
            modules.setdefault(_module_of(name)[0], []).append(tensor)
    chosen = _Selection()
    for module, tensors in modules.items():
        weight = trained.tensors.get(f"{module}.weight")
        embedding_like = is_embedding(module) or is_head(module)
        whole = module in options.save_modules or _last(module) in options.save_modules
        if embedding_like and not options.embed_lora:
            whole = whole or not _search(options.exclude, module)
        if not whole:
            if options.include and not _search(options.include, module):
                continue
            if _search(options.exclude, module):
                continue
        if not whole and weight is not None and len(weight.shape) == 2:
            base_weight = base.tensors[weight.name]
            chosen.factored.append(_Module(module, base_weight, weight, is_embedding(module)))
            for tensor in tensors:
                if tensor is not weight:  # a bias: its change, added by lora_B.bias
                    chosen.biases.append((base.tensors[tensor.name], tensor))
        elif whole or not options.skip_undecomposable:
            chosen.whole.extend((t.name, t) for t in tensors)
            chosen.whole_modules.append(module)
    _add_tied_head(base, trained, options, chosen, modules)
    return chosen


def _tied(trained: Checkpoint) -> bool:
    """Whether the config ties the head to the input embedding (transformers' default)."""
    config = trained.config
    scopes = [config.get("text_config"), config]
    for scope in scopes:
        if isinstance(scope, dict) and "tie_word_embeddings" in scope:
            return bool(scope["tie_word_embeddings"])
    return True


def _add_tied_head(
    base: Checkpoint,
    trained: Checkpoint,
    options: LoraOptions,
    chosen: _Selection,
    modules: dict[str, list[TensorInfo]],
) -> None:
    """A tied head (no `lm_head` tensor: it is the input embedding) goes in the adapter as
    mergekit puts it there: saved whole as `lm_head`, or factored as a Linear with
    `embed_lora`; otherwise peft would leave the merged head on BASE's embedding."""
    embeddings = [m for m in modules if _last(m) == "embed_tokens"]
    if any(is_head(m) for m in modules) or len(embeddings) != 1 or not _tied(trained):
        return
    embedding = trained.tensors[f"{embeddings[0]}.weight"]
    prefix = embeddings[0].rsplit(".", 2)[0] + "." if embeddings[0].count(".") > 1 else ""
    head = f"{prefix}lm_head"  # beside the decoder: `lm_head`, `language_model.lm_head`
    if _search(options.exclude, head):
        return
    if not options.embed_lora:
        chosen.whole.append((f"{head}.weight", embedding))
        chosen.whole_modules.append(head)
        chosen.tied_head = True
    elif not options.include or _search(options.include, head):
        chosen.factored.append(_Module(head, base.tensors[embedding.name], embedding, False))
        chosen.tied_head = True


def _sketch_rank(module: _Module, options: LoraOptions) -> int:
    """The rank a module's singular values are computed for, by `_ranks` and again by its
    factors: the same number, so the randomized solver draws the same sketch both times."""
    return min(options.rank, *module.shape)


def _ranks(pool: SourcePool, modules: Sequence[_Module], options: LoraOptions) -> dict[str, int]:
    """Each module's rank: `options.rank` at most, and with a threshold only the singular
    values above it (computed here, one weight at a time, so the header is known first)."""
    ranks = {}
    for module in modules:
        top = _sketch_rank(module, options)
        if options.sv_epsilon > 0:
            values = _on_factoring_thread(_values, pool, module, top, options.solver)
            top = kept_rank(values, options.rank, options.sv_epsilon)
        ranks[module.name] = top
    return ranks


def config_keys(chosen: Sequence[str], every: Sequence[str]) -> list[str]:
    """peft's names for `chosen` modules: a last name part (`q_proj`) where every module of the
    checkpoint with that last part is chosen, else the full names (peft matches both)."""
    chosen_set = set(chosen)
    keys: list[str] = []
    for module in chosen:
        last = _last(module)
        same = [m for m in every if _last(m) == last]
        key = last if all(m in chosen_set for m in same) else module
        if key not in keys:
            keys.append(key)
    return sorted(keys)


def adapter_config(
    base_name: str, ranks: dict[str, int], selection: _Selection, every: Sequence[str]
) -> dict:
    """adapter_config.json (peft's LoraConfig), with mergekit-extract-lora's keys and values:
    `lora_alpha` equal to `r` (a scale of 1), `rank_pattern` and `alpha_pattern` for the modules
    of a lower rank."""
    top = max(ranks.values())
    lower = {name: rank for name, rank in sorted(ranks.items()) if rank != top}
    config = {
        "base_model_name_or_path": base_name,
        "peft_type": "LORA",
        "use_rslora": False,
        "target_modules": config_keys(list(ranks), every),
        "modules_to_save": config_keys(selection.whole_modules, every),
        "task_type": "CAUSAL_LM",
        "r": top,
        "lora_alpha": top,
        "rank_pattern": lower,
        "alpha_pattern": dict(lower),
        "lora_dropout": 0.0,
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    if selection.biases:
        config["lora_bias"] = True
    return config


def _selected_names(
    trained: Checkpoint, layers: str | None, stack: str | None, modules: str | None
) -> tuple[set[str] | None, dict]:
    """The tensors the layer spec and module filter leave in (None: all), and what the recipe
    records of them."""
    if layers is None and modules is None:
        return None, {}
    chosen_stack = select_stack(trained.stacks, stack)
    spec = layers if layers is not None else ":"
    indices = set(parse_layer_spec(spec, chosen_stack.num_layers))
    module_filter = parse_module_filter(modules) if modules is not None else None
    if module_filter is not None:
        require_modules(module_filter, trained.tensors, chosen_stack, indices)
    names = {n for n in trained.tensors if stack_layer(n, chosen_stack, module_filter) in indices}
    recorded = {"layers": format_layers(indices), "stack": chosen_stack.name, "modules": modules}
    return names, recorded


def _check(trained: Checkpoint, options: LoraOptions) -> None:
    if options.rank < 1:
        raise LayerSpecError(f"--rank must be at least 1, not {options.rank}")
    if options.sv_epsilon < 0:
        raise LayerSpecError(f"--sv-epsilon must be 0 or more, not {options.sv_epsilon:g}")
    if options.solver.method not in SOLVERS:
        raise LayerSpecError(f"--svd must be one of {', '.join(SOLVERS)}")
    for pattern in [*options.include, *options.exclude]:
        try:
            re.compile(pattern)
        except re.error as error:
            raise LayerSpecError(f"regex {pattern!r} does not compile: {error}") from None
    if trained.model_type in _TRANSPOSED:
        raise SurgeryError(
            f"extract-lora does not support {trained.model_type}: its linear weights are stored "
            "transposed (Conv1D)"
        )


def plan_extract_lora(
    base: Checkpoint,
    trained: Checkpoint,
    options: LoraOptions,
    *,
    layers: str | None = None,
    stack: str | None = None,
    modules: str | None = None,
) -> Plan:
    """Plan the adapter `B A` per module with `W_base + B A` close to `W_trained` (see the
    module docstring for what is factored and what saved whole).

    Raises:
        MismatchError: the checkpoints do not line up (names, shapes, dtypes).
        LayerSpecError: a bad rank, threshold, regex, solver, layer spec or module filter.
        SurgeryError: nothing left to factor, or an unsupported architecture.
    """
    _check(trained, options)
    check_compatible([trained, base], ["trained", "base"], float_dtypes_may_differ=False)
    selected, recorded = _selected_names(trained, layers, stack, modules)
    selection = _classify(base, trained, options, selected)
    with SourcePool(openers([base, trained])) as pool:
        ranks = _ranks(pool, selection.factored, options)
    factored = [m for m in selection.factored if ranks[m.name] > 0]  # all discarded: left out
    ranks = {m.name: ranks[m.name] for m in factored}
    if not factored:
        raise SurgeryError("extract-lora: no weight left to factor (check the filters, --rank)")
    tensors = [t for m in factored for t in _factor_tensors(m, ranks[m.name], options)]
    for base_bias, bias in selection.biases:
        delta = blend_of([Source(bias, 1.0), Source(base_bias, -1.0)])
        module = _module_of(bias.name)[0]
        tensors.append(dataclasses.replace(delta, name=f"{PREFIX}{module}.lora_B.bias"))
    tensors += [dataclasses.replace(copy_of(t), name=PREFIX + n) for n, t in selection.whole]
    every = sorted({_module_of(n)[0] for n in trained.tensors})
    if selection.tied_head:
        every = sorted({*every, *selection.whole_modules, *ranks})
    base_name = base.spec or str(base.path)
    solver = options.solver
    recipe = make_recipe(
        "extract-lora",
        [("base", base), ("trained", trained)],
        rank=options.rank,
        max_rank_kept=max(ranks.values()),
        sv_epsilon=options.sv_epsilon or None,
        embed_lora=options.embed_lora or None,
        save_modules=list(options.save_modules) or None,
        include=list(options.include) or None,
        exclude=list(options.exclude) or None,
        skip_undecomposable=options.skip_undecomposable or None,
        distribute_scale=None if solver.distribute_scale else False,
        svd=solver.method,
        seed=solver.seed if solver.method == "randomized" else None,
        **recorded,
    )
    return Plan(
        "extract-lora",
        tensors,
        recipe,
        files_from=trained,
        inputs=[base, trained],
        shards={ADAPTER_WEIGHTS: [t.name for t in tensors]},
        adapter=adapter_config(base_name, ranks, selection, every),
    )
