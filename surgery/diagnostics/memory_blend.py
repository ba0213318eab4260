"""In-memory blends for sweeps and localization: load TRAINED once and read BASE's tensors from
its files, then set the model's weights to any per-layer interpolation without writing a
checkpoint.

Blends use the streaming writer's kernel (surgery/blend.py) and round to the checkpoint's storage
dtype, so a model blended here holds exactly the weights of the checkpoint `surgery interpolate`
would write, and scores exactly the same.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from surgery.core.dtypes import torch_dtype
from surgery.core.layers import LayerValues, Stack, find_stacks, select_stack, stack_layer
from surgery.core.modules import ModuleFilter
from surgery.engine.blend import accumulate, accumulator_dtype, finish
from surgery.engine.matching import match
from surgery.engine.naming import layout_of
from surgery.engine.reader import Checkpoint
from surgery.hub.resolve import open_input


def storage_dtype(checkpoint: Checkpoint) -> str:
    """The float dtype most of a checkpoint's parameters are stored in."""
    counts: Counter[str] = Counter()
    for tensor in checkpoint:
        if tensor.is_float:
            counts[tensor.dtype] += tensor.numel
    return counts.most_common(1)[0][0] if counts else "F32"


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def fits_in_memory(checkpoint: Checkpoint, dtype_bytes: int = 4, copies: int = 3) -> bool:
    """Whether `copies` copies of the model (working, base, trained) fit in 80% of free memory."""
    return checkpoint.num_params * dtype_bytes * copies < 0.8 * _available_memory()


# What an in-memory blend does with tensors without counterpart and a grown vocabulary.
LONELY = (
    "tensors without counterpart stay trained's, and so do the rows only trained has; the rows "
    "both have are blended"
)


def _matched(
    params: dict[str, torch.Tensor], base: Checkpoint, storage: torch.dtype
) -> dict[str, torch.Tensor]:
    """BASE's tensors under the names of TRAINED's loaded parameters, in `storage` dtype.

    They are read from BASE's files, not from a loaded model: names are matched as the
    checkpoints are (see `surgery.engine.naming`: in-memory and on-disk names may follow other
    layouts), so BASE needs no model class of its own (a multimodal Mistral-3 has none for
    causal LM), and its tensors without a counterpart (a vision tower) are never read.

    Raises:
        RuntimeError: a parameter of TRAINED's text model that BASE does not have.
    """
    from safetensors import safe_open

    mine, theirs = layout_of(params), layout_of(base.tensors)
    by_canonical = {theirs.canonical[name]: base.tensors[name] for name in base.tensors}
    wanted: dict[Path, dict[str, str]] = {}  # file -> BASE's name -> TRAINED's name
    for name, canonical in mine.canonical.items():
        if canonical in by_canonical:
            tensor = by_canonical[canonical]
            wanted.setdefault(tensor.file, {})[tensor.name] = name
        elif name not in mine.others:
            raise RuntimeError(f"BASE has no tensor for TRAINED's parameter {name!r}")
    matched = {}
    for file, names in wanted.items():
        with safe_open(str(file), framework="pt") as handle:
            for theirs_name, name in names.items():
                matched[name] = handle.get_tensor(theirs_name).to(params[name].device, storage)
    return matched


class MemoryBlender:
    """A loaded model whose weights can be set to any interpolation of BASE and TRAINED.

    Memory: the working model, one copy each of the base and trained parameters in the
    checkpoint's storage dtype (exact: they were loaded from it), and two scratch buffers the
    size of the largest parameter. Blends are exact when the model's dtype is at least as wide as
    the storage dtype (the default: float32 on CPU). BASE's parameters are matched to
    TRAINED's as `surgery interpolate` matches the checkpoints (a multimodal BASE and a
    text-only TRAINED; a grown vocabulary: the rows both have are blended).

    Args:
        base, trained: the two checkpoints (folders, Hub ids or opened).
        load: `load(folder) -> (model, tokenizer)`, as the scorer loads models
            (`surgery.diagnostics.scoring.Scorer.load`: its device and dtype); TRAINED is
            loaded, BASE's tensors are read from its files.
    """

    def __init__(
        self,
        base: str | Path | Checkpoint,
        trained: str | Path | Checkpoint,
        load: Callable[[Path], tuple[Any, Any]],
    ) -> None:
        base_ckpt, trained_ckpt = (
            c if isinstance(c, Checkpoint) else open_input(c) for c in (base, trained)
        )
        match(
            [trained_ckpt, base_ckpt],
            ["trained", "base"],
            float_dtypes_may_differ=False,
            vocabulary=True,
            lonely=LONELY,
        )
        self.storage = torch_dtype(storage_dtype(trained_ckpt))
        self.acc_dtype = accumulator_dtype(storage_dtype(trained_ckpt), [storage_dtype(base_ckpt)])
        self.model, self.tokenizer = load(trained_ckpt.path)
        self.params = dict(self.model.named_parameters())
        self.trained = {n: p.detach().to(self.storage, copy=True) for n, p in self.params.items()}
        self.base = _matched(self.params, base_ckpt, self.storage)
        self.stacks = find_stacks(self.params)
        self.alphas = dict.fromkeys(self.params, 1.0)  # what each parameter holds now
        self.scratch: dict[torch.dtype, torch.Tensor] = {}

    def stack(self, name: str | None) -> Stack:
        """An in-memory layer stack by name (text, vision); in-memory prefixes may differ from
        those on disk (Gemma-3 multimodal), names do not."""
        return select_stack(self.stacks, name)

    @torch.no_grad()
    def set_alphas(
        self, values: LayerValues, stack: Stack | None, modules: ModuleFilter | None = None
    ) -> None:
        """Weights <- (1 - a) * BASE + a * TRAINED with a per layer of `stack` from `values`,
        narrowed to `modules`; tensors `values` does not cover (value None) come from TRAINED."""
        for name, param in self.params.items():
            layer = stack_layer(name, stack, modules) if stack is not None else None
            alpha = values.value_for(layer)
            alpha = 1.0 if alpha is None or name not in self.base else alpha
            if alpha == self.alphas[name]:
                continue  # unchanged since the last point: layers outside --layers stay put
            self.alphas[name] = alpha
            if alpha == 1.0:
                param.copy_(self.trained[name])
                continue
            # The rows both have (all of them, unless the vocabulary grew: the added rows stay
            # TRAINED's, as `surgery interpolate` writes them).
            part, base, trained = param, self.base[name], self.trained[name]
            if base.shape != param.shape:
                rows = min(base.shape[0], param.shape[0])
                part, base, trained = param[:rows], base[:rows], trained[:rows]
            if alpha == 0.0:
                part.copy_(base)
                continue
            # The writer's exact operations on the same storage-dtype values (surgery/blend.py).
            flat = part.view(-1)
            acc = flat if flat.dtype == self.acc_dtype else self._scratch(self.acc_dtype, flat)
            inputs = [(base.reshape(-1), 1.0 - alpha), (trained.reshape(-1), alpha)]
            rounded = self._scratch(self.storage, flat)
            finish(accumulate(acc, inputs), 1.0, rounded)  # the checkpoint's one rounding
            flat.copy_(rounded)

    def _scratch(self, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
        """A reused buffer of `dtype` shaped like the flat `like` (no allocation per point)."""
        buffer = self.scratch.get(dtype)
        if buffer is None or buffer.numel() < like.numel():
            largest = max(p.numel() for p in self.params.values())
            buffer = self.scratch[dtype] = torch.empty(largest, dtype=dtype, device=like.device)
        return buffer[: like.numel()]
