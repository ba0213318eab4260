"""In-memory blends for sweeps and localization: load BASE and TRAINED once, then set the model's
weights to any per-layer interpolation without writing a checkpoint.

Blends use the streaming writer's kernel (surgery/blend.py) and round to the checkpoint's storage
dtype, so a model blended here holds exactly the weights of the checkpoint `surgery interpolate`
would write, and scores exactly the same.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import torch

from surgery.blend import accumulate, accumulator_dtype, finish
from surgery.dtypes import torch_dtype
from surgery.layers import LayerValues, Stack, find_stacks, select_stack, stack_layer
from surgery.plan import check_compatible
from surgery.reader import Checkpoint, open_checkpoint


def storage_dtype(checkpoint: Checkpoint) -> str:
    """The float dtype most of a checkpoint's parameters are stored in."""
    counts = Counter({})
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


class MemoryBlender:
    """A loaded model whose weights can be set to any interpolation of BASE and TRAINED.

    Memory: the working model plus one copy each of the base and trained parameters.
    """

    def __init__(
        self,
        base: str | Path,
        trained: str | Path,
        *,
        device: str = "cpu",
        dtype: str | None = None,
    ) -> None:
        from eval.api import load_model

        base_ckpt, trained_ckpt = open_checkpoint(base), open_checkpoint(trained)
        check_compatible(
            [trained_ckpt, base_ckpt], ["trained", "base"], float_dtypes_may_differ=False
        )
        self.checkpoint = trained_ckpt
        self.storage = torch_dtype(storage_dtype(trained_ckpt))
        self.acc_dtype = accumulator_dtype(storage_dtype(trained_ckpt), [storage_dtype(base_ckpt)])
        self.model, self.tokenizer = load_model(trained_ckpt.path, device, dtype, progress=False)
        base_model, _ = load_model(base_ckpt.path, device, dtype, progress=False)
        self.params = dict(self.model.named_parameters())
        self.trained = {name: p.detach().clone() for name, p in self.params.items()}
        self.base = {name: p.detach() for name, p in base_model.named_parameters()}
        if self.base.keys() != self.trained.keys():
            raise RuntimeError("BASE and TRAINED loaded into different parameter sets")
        self.stacks = find_stacks(self.params)

    def stack(self, name: str | None) -> Stack:
        """An in-memory layer stack by name (text, vision); in-memory prefixes may differ from
        those on disk (Gemma-3 multimodal), names do not."""
        return select_stack(self.stacks, name)

    @torch.no_grad()
    def set_alphas(self, values: LayerValues, stack: Stack | None) -> None:
        """Weights <- (1 - a) * BASE + a * TRAINED with a per layer of `stack` from `values`;
        tensors `values` does not cover (value None) come from TRAINED."""
        for name, param in self.params.items():
            layer = stack_layer(name, stack) if stack is not None else None
            alpha = values.value_for(layer)
            alpha = 1.0 if alpha is None else alpha
            if alpha == 1.0:
                param.copy_(self.trained[name])
            elif alpha == 0.0:
                param.copy_(self.base[name])
            else:
                acc = torch.empty(param.numel(), dtype=self.acc_dtype, device=param.device)
                inputs = [
                    (self.base[name].reshape(-1), 1.0 - alpha),
                    (self.trained[name].reshape(-1), alpha),
                ]
                blended = torch.empty(param.numel(), dtype=self.storage, device=param.device)
                finish(accumulate(acc, inputs), 1.0, blended)  # the checkpoint's rounding
                param.copy_(blended.reshape(param.shape))
