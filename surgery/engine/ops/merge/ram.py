"""ram and ramplus_tl (Reinforced Agent Merging, arXiv 2601.13572): task vectors whose element
only one model changes (|delta| > epsilon) are added whole, elements several models change are
averaged over those models.

ram is elementwise: one map pass. ramplus_tl scales each model's unique elements by
1 + r * clamp(shared / unique, 0, alpha), from the counts of that model's elements changed
alone or together with others in the whole tensor: one counting pass before the map.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from surgery.engine.ops.merge.arrays import Inputs, Output
from surgery.engine.ops.merge.kernel import Kernel, computed
from surgery.engine.ops.merge.method import Base, Method, Param, Scope, TensorJob
from surgery.engine.plan import OutputTensor, copy_of


def _changes(chunk: list[np.ndarray], epsilon: float) -> tuple[list, list, np.ndarray]:
    """(task vectors, their |delta| > epsilon masks, how many models change each element) of
    one chunk whose first array is the base's."""
    base, *models = chunk
    deltas = [np.subtract(m, base, out=m) for m in models]
    changed = [np.abs(d) > epsilon for d in deltas]
    counts = np.zeros(base.shape, np.int32)
    for mask in changed:
        counts += mask
    return deltas, changed, counts


class Ram(Kernel):
    """base + sum_i delta_i * changed_i * (lambda_i where unique, 1 / count where shared)."""

    def __init__(self, job: TensorJob, plus: bool) -> None:
        order = [job.base, *job.non_base]
        super().__init__(job.name, [job.inputs[i] for i in order], job.out_dtype)
        self.plus = plus
        self.epsilon = float(job.shared["epsilon"])
        self.r = float(job.shared.get("r", 0.0))
        self.alpha = float(job.shared.get("alpha", 0.0))

    def prepare(self, inputs: Inputs) -> list | None:
        """ramplus_tl's lambda per model, from one counting pass (ram: none)."""
        if not self.plus:
            return None
        models = len(self.inputs) - 1
        shared, unique = [0] * models, [0] * models
        for _, chunk in inputs.chunks():
            _, changed, counts = _changes(chunk, self.epsilon)
            alone = counts == 1
            for i, mask in enumerate(changed):
                only = int(np.count_nonzero(mask & alone))
                unique[i] += only
                shared[i] += int(np.count_nonzero(mask)) - only  # changed, with others
        # float32 as in mergekit: int counts / clamp(count, min=epsilon) promote to float32.
        f32 = np.float32
        lambdas = []
        for s, u in zip(shared, unique, strict=True):
            rho = f32(s) / max(f32(u), f32(self.epsilon))
            lambdas.append(f32(1) + f32(self.r) * np.clip(rho, f32(0), f32(self.alpha)))
        return lambdas

    def map_part(self, inputs: Inputs, out: Output, part: range, state: object) -> None:
        """The merged task vector added to the base, chunk by chunk."""
        work = inputs.work
        lambdas = [work(x) for x in state] if state is not None else None
        for start, chunk in inputs.chunks(part=part):
            base = chunk[0]
            deltas, changed, counts = _changes(chunk, self.epsilon)
            alone = counts == 1
            divisor = np.maximum(counts, 1).astype(work)
            total = np.zeros(base.shape, work)
            for i, (delta, mask) in enumerate(zip(deltas, changed, strict=True)):
                delta *= mask
                term = delta * alone
                if lambdas is not None:
                    term *= lambdas[i]
                term += delta * (counts > 1) / divisor
                total += term
            out.put(start, np.add(base, total, out=total))


def build(job: TensorJob, plus: bool) -> OutputTensor:
    """One ram or ramplus_tl tensor; the base itself where no other model feeds it."""
    if not job.non_base:
        return copy_of(job.inputs[job.base], job.out_dtype)
    return computed(Ram(job, plus), job.shape)


METHODS = (
    Method(
        name="ram",
        params=(Param("epsilon", Scope.SHARED, float, 1e-5),),
        build=partial(build, plus=False),
        base=Base.REQUIRED,
    ),
    Method(
        name="ramplus_tl",
        params=(
            Param("r", Scope.SHARED, float, 0.1),
            Param("alpha", Scope.SHARED, float, 0.2),
            Param("epsilon", Scope.SHARED, float, 1e-5),
        ),
        build=partial(build, plus=True),
        base=Base.REQUIRED,
    ),
)
