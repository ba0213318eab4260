"""mergekit 0.1.5's own arithmetic, for `surgery merge --mergekit-arithmetic`.

By default a merge computes in float32 (float64 for 64-bit inputs) and rounds once to the
output dtype. mergekit instead casts every input to the config's `dtype` (or, without one, to
the inputs' promoted dtype) and runs its method's torch operations in it: in bf16 each operation
rounds. This mode runs those very torch operations, in mergekit's order and dtypes, on chunks of
the tensor, so that the output is bit-identical to `mergekit-yaml`'s. Every operation is
elementwise or a reduction over the models axis, so chunking changes no bit.

Methods: linear, and the generalized task arithmetic variants (task_arithmetic, ties, dare_ties,
dare_linear, breadcrumbs, breadcrumbs_ties, della, della_linear) where every density is at least
1: mergekit's sparsifiers then return the delta untouched, and no random mask or magnitude rank
is involved. Anything else is refused (a `MergeConfigError` naming it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from surgery.core.dtypes import torch_dtype
from surgery.engine.ops.merge.arrays import Inputs, Output
from surgery.engine.ops.merge.kernel import Kernel, computed
from surgery.engine.ops.merge.linear import weight_divisor
from surgery.engine.ops.merge.method import TensorJob
from surgery.engine.ops.merge.spec import MergeConfigError
from surgery.engine.ops.merge.task_arithmetic import VARIANTS, Variant
from surgery.engine.plan import OutputTensor

if TYPE_CHECKING:
    import torch

FLAG = "--mergekit-arithmetic"
_VARIANTS = {v.name: v for v in VARIANTS}
REPRODUCED = ("linear", *_VARIANTS)


def check_method(name: str) -> None:
    """Refuse a method this mode does not reproduce.

    Raises:
        MergeConfigError: naming the method and the ones the mode does.
    """
    if name not in REPRODUCED:
        raise MergeConfigError(
            f"{FLAG} does not reproduce {name}; only {', '.join(REPRODUCED)} (at density 1)"
        )


def compute_dtype(config_dtype: str | None, input_dtypes: list[str]) -> str:
    """The dtype mergekit computes in: the config's `dtype`, else the inputs' promoted dtype
    (torch.promote_types over the float dtypes: one dtype stays itself, F64 wins, any other mix
    is F32)."""
    if config_dtype:
        return config_dtype
    found = set(input_dtypes)
    if len(found) == 1:
        return found.pop()
    return "F64" if "F64" in found else "F32"


class MergekitKernel(Kernel):
    """One tensor of a merge, computed by mergekit's torch operations in `dtype`, chunk by chunk."""

    def __init__(self, job: TensorJob, method: str, dtype: str) -> None:
        super().__init__(job.name, job.inputs, job.out_dtype)
        self.job, self.method, self.dtype = job, method, dtype
        self.variant: Variant | None = _VARIANTS.get(method)

    def map_part(self, inputs: Inputs, out: Output, part: range, state: object) -> None:
        """Each chunk: the inputs cast to `dtype`, mergekit's method, the result cast to the
        output dtype (as mergekit's save), handed to `put` as exactly representable floats."""
        import torch

        dtype, out_dtype = torch_dtype(self.dtype), torch_dtype(self.out_dtype)
        carrier = torch.float64 if self.out_dtype == "F64" else torch.float32
        for start, chunks in inputs.chunks(self.step, part):
            # Decoded exactly (float32 or float64), then cast once to `dtype`, as mergekit's load.
            tensors = [torch.from_numpy(c).to(dtype) for c in chunks]
            with torch.no_grad():
                result = self._combine(tensors)
            # mergekit's `.to(out_dtype)`; then float32 (float64) holds it exactly, and `put`'s
            # rounding to the output dtype changes nothing.
            values = result.to(out_dtype).to(carrier).numpy()
            out.put(start, np.ascontiguousarray(values))

    def _combine(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        if self.variant is None:
            weights = [float(p["weight"]) for p in self.job.per_input]
            return linear(tensors, weights, bool(self.job.shared["normalize"]))
        base = tensors[self.job.base]
        others = [tensors[i] for i in self.job.non_base]
        weights = [float(self.job.per_input[i]["weight"]) for i in self.job.non_base]
        return task_arithmetic(base, others, weights, self.variant.consensus, self.job.shared)


def linear(tensors: list[torch.Tensor], weights: list[float], normalize: bool) -> torch.Tensor:
    """mergekit's `linear_merge` on one chunk: addcmul_ into float32 (float64) accumulators,
    one division by the float32 weight sum, the result cast back to the inputs' dtype."""
    import torch

    first = tensors[0]
    accumulator = torch.float64 if first.dtype == torch.float64 else torch.float32
    weight = torch.tensor([weights], dtype=accumulator)  # mergekit's (batch, models) tensor
    denominator = weight.sum(dim=1) if normalize else None
    result = torch.zeros_like(first, dtype=accumulator)
    for tensor, coefficient in zip(tensors, weight.unbind(1), strict=True):
        result.addcmul_(tensor, coefficient)
    if denominator is not None:
        result.div_(denominator)
    return result.to(first.dtype)


def task_arithmetic(
    base: torch.Tensor,
    others: list[torch.Tensor],
    weights: list[float],
    consensus: bool,
    shared: dict[str, object],
) -> torch.Tensor:
    """mergekit's `GeneralizedTaskArithmeticMerge.merge_group` on one chunk, at density 1: every
    step in the inputs' dtype (deltas, weights, sign election, sums over the models axis)."""
    import torch

    if not others:
        return base
    deltas = base.new_empty((len(others), *base.shape))
    for index, tensor in enumerate(others):
        deltas[index] = tensor - base
    weight = torch.tensor(weights, dtype=deltas.dtype)
    while deltas.dim() > weight.dim():
        weight.unsqueeze_(-1)
    deltas.mul_(weight)
    if consensus:
        mask = _sign_mask(deltas, torch.int8 if shared["int8_mask"] else base.dtype)
        mixed = (deltas * mask).sum(dim=0)
        divisor = (weight * mask).sum(dim=0)
        divisor[divisor == 0] = 1
    else:
        mixed = deltas.sum(dim=0)
        divisor = weight.sum(dim=0)
        divisor[divisor.abs() < 1e-8] = 1
    if shared["normalize"]:
        mixed /= divisor
    if float(shared["lambda"]) != 1:
        mixed *= float(shared["lambda"])
    return (base + mixed).to(base.dtype)


def _sign_mask(deltas: torch.Tensor, mask_dtype: torch.dtype) -> torch.Tensor:
    """mergekit's `get_mask(method="sum")`: each delta whose sign is the sign of the sum."""
    sign = deltas.sign().to(mask_dtype)
    majority = (deltas.sum(dim=0) >= 0).to(mask_dtype) * 2 - 1
    return sign == majority


def build(job: TensorJob, method: str, config_dtype: str | None) -> OutputTensor:
    """One output tensor of `method` in mergekit's arithmetic.

    Raises:
        MergeConfigError: a density below 1 (random or magnitude masks are not reproduced), or
            linear weights that sum to 0 under `normalize`.
    """
    if method in _VARIANTS:  # the method itself was checked once by `plan_merge`
        for index in job.non_base:
            density = float(job.per_input[index]["density"])
            if density < 1:
                raise MergeConfigError(
                    f"{FLAG} does not reproduce {method} at density {density} "
                    f"({job.name!r}); only at density 1"
                )
    else:
        weight_divisor(job)  # the default's refusal: weights that sum to 0 under `normalize`
    dtype = compute_dtype(config_dtype, [t.dtype for t in job.inputs])
    return computed(MergekitKernel(job, method, dtype), job.shape)
