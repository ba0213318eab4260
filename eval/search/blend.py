"""In-memory soups of BASE and several experts, for `surgery search`: the first expert is
loaded once, BASE's and the other experts' tensors are read once from their files, and each
trial sets the model's weights to its per-layer weights (`eval.search.mix.Mix`) in place.

Each tensor is the `linear` merge's weighted sum (`surgery.engine.blend`: the inputs in the
order BASE, expert 1, ..., those of weight 0 left out, one rounding to the storage dtype), so
the model holds exactly the weights `surgery merge` writes from the profile's config.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from eval.search.mix import Mix, Weights
from surgery.core.dtypes import torch_dtype
from surgery.core.layers import Stack, find_stacks, stack_layer
from surgery.diagnostics.memory_blend import MemoryBlender, _matched, storage_dtype
from surgery.engine.blend import accumulate, accumulator_dtype, finish
from surgery.engine.matching import match
from surgery.engine.reader import Checkpoint

# Tensors of BASE without counterpart in the experts (a multimodal BASE's vision tower).
LONELY = "BASE's tensors without counterpart in the experts are left out (its text model is mixed)"


class SoupBlender:
    """A loaded model whose weights can be set to any per-layer soup of BASE and the experts.

    Memory: the working model, one copy of each input's parameters in the checkpoints' storage
    dtype, and two scratch buffers the size of the largest parameter
    (`eval.search.experts.peak_bytes` estimates it before anything loads).

    Args:
        base, experts: the opened checkpoints (the experts of one architecture and dtype).
        load: `load(folder) -> (model, tokenizer)`; the first expert is loaded.
    """

    def __init__(
        self,
        base: Checkpoint,
        experts: Sequence[Checkpoint],
        load: Callable[[Path], tuple[Any, Any]],
    ) -> None:
        labels = [f"expert {i + 1} ({c.path})" for i, c in enumerate(experts)]
        match([*experts, base], [*labels, "base"], float_dtypes_may_differ=False, lonely=LONELY)
        self.storage = torch_dtype(storage_dtype(experts[0]))
        self.acc_dtype = accumulator_dtype(storage_dtype(experts[0]), [storage_dtype(base)])
        self.model, self.tokenizer = load(experts[0].path)
        self.params = dict(self.model.named_parameters())
        first = {n: p.detach().to(self.storage, copy=True) for n, p in self.params.items()}
        others = [_matched(self.params, c, self.storage) for c in experts[1:]]
        # Each parameter's inputs in the merge's order: BASE, expert 1, ..., expert K.
        self.inputs = [_matched(self.params, base, self.storage), first, *others]
        self.stacks = find_stacks(self.params)
        self.weights: dict[str, Weights | None] = dict.fromkeys(self.params)
        self.scratch: dict[torch.dtype, torch.Tensor] = {}

    stack = MemoryBlender.stack

    @torch.no_grad()
    def set_mix(self, mix: Mix, stack: Stack) -> None:
        """Weights <- each layer's (or outside the stack, `mix.outside`) weighted sum."""
        for name, param in self.params.items():
            layer = stack_layer(name, stack)
            chosen = mix.outside if layer is None else mix.layers[layer]
            if chosen == self.weights[name]:
                continue  # unchanged since the last profile
            self.weights[name] = chosen
            sources = [
                (values[name].reshape(-1), weight)
                for values, weight in zip(self.inputs, chosen, strict=True)
                if weight
            ]
            flat = param.view(-1)
            if len(sources) == 1 and sources[0][1] == 1.0:
                flat.copy_(sources[0][0])  # the merge copies a lone input of weight 1
                continue
            acc = flat if flat.dtype == self.acc_dtype else self._scratch(self.acc_dtype, flat)
            rounded = self._scratch(self.storage, flat)
            finish(accumulate(acc, sources), 1.0, rounded)  # the checkpoint's one rounding
            flat.copy_(rounded)

    # The same reused scratch buffers as the two-checkpoint blender's.
    _scratch = MemoryBlender._scratch
