"""similarity: how alike several experts' task vectors (expert - base) are, per layer and per
module kind. Streamed, like `drift`.

For experts i and j with task vectors d_i = e_i - b:
cosine = <d_i, d_j> / (||d_i|| ||d_j||); L2 distance = ||d_i - d_j|| (which is ||e_i - e_j||).
A layer's (or a module kind's) value is that of its tensors' task vectors concatenated: the dot
products, squared norms and squared distances add across tensors in float64, never the cosines.
Each tensor of each input is read once, in bounded chunks; only N x N sums per group are kept, so
memory does not grow with the number of layers. Regions (early, middle and late thirds of the
stack) average their layers' values, as the paper's `analyze_divergence.py` pools them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from surgery.core.layers import Stack, select_stack, stack_layer
from surgery.core.threads import current_threads
from surgery.diagnostics.drift import module_kind
from surgery.engine.float_codec import CODEC_DTYPES, decode
from surgery.engine.matching import match
from surgery.engine.progress import byte_progress
from surgery.engine.reader import Checkpoint, TensorInfo, openers
from surgery.engine.source import SourcePool
from surgery.engine.values import tensor_bytes, tensor_values

# Elements of all inputs' chunks together: N + 1 float64 arrays of about 16 MiB in all per
# worker, whatever the number of experts.
_BUDGET = 2**21


@dataclass
class PairSums:
    """N x N sums from which cosines and distances follow; they add across tensors.

    `gram[i, j]` = <d_i, d_j> (its diagonal holds the squared norms), `dist_sq[i, j]` =
    ||d_i - d_j||^2, both symmetric.
    """

    gram: np.ndarray
    dist_sq: np.ndarray
    numel: int = 0

    @classmethod
    def zeros(cls, n: int, numel: int = 0) -> PairSums:
        """Sums of nothing yet, for `n` experts."""
        return cls(np.zeros((n, n)), np.zeros((n, n)), numel)

    def add(self, other: PairSums) -> None:
        """Accumulate another tensor's (or group's) sums."""
        self.gram += other.gram
        self.dist_sq += other.dist_sq
        self.numel += other.numel

    def cosine(self) -> np.ndarray:
        """N x N cosines: ones on the diagonal; 1 where both task vectors are zero (neither
        expert moved), 0 where only one is (as torch's cosine_similarity gives)."""
        norms = np.sqrt(np.diag(self.gram))
        n = len(norms)
        out = np.eye(n)
        for i in range(n):
            for j in range(i + 1, n):
                if norms[i] == 0 or norms[j] == 0:
                    value = 1.0 if norms[i] == norms[j] else 0.0
                else:
                    value = self.gram[i, j] / (norms[i] * norms[j])
                out[i, j] = out[j, i] = value
        return out

    def distance(self) -> np.ndarray:
        """N x N L2 distances ||d_i - d_j|| (zeros on the diagonal)."""
        return np.sqrt(self.dist_sq)

    def rms_distance(self) -> np.ndarray:
        """Distances per parameter, ||d_i - d_j|| / sqrt(params): the reference's
        `l2_dist` (normalized L2 distance)."""
        return self.distance() / math.sqrt(self.numel) if self.numel else self.distance()


@dataclass
class SimilarityReport:
    """Pairwise task-vector similarity per layer of the chosen stack, per module kind, per
    (layer, kind) and over every tensor compared."""

    labels: list[str]
    stack: Stack | None
    layers: dict[int, PairSums] = field(default_factory=dict)
    kinds: dict[str, PairSums] = field(default_factory=dict)
    layer_kinds: dict[tuple[int, str], PairSums] = field(default_factory=dict)
    total: PairSums | None = None
    # Tensors whose rows differ (a grown vocabulary) -> rows compared (those every input has).
    shared_rows: dict[str, int] = field(default_factory=dict)

    def regions(self) -> dict[str, list[int]]:
        """early, middle and late layers: thirds of the stack as `analyze_divergence.py` cuts
        them (third = layers // 3; the late region takes the remainder); empty ones left out."""
        if self.stack is None:
            return {}
        count = self.stack.num_layers
        third = count // 3
        cuts = {
            "early": range(0, third),
            "middle": range(third, 2 * third),
            "late": range(2 * third, count),
        }
        regions = {name: [i for i in span if i in self.layers] for name, span in cuts.items()}
        return {name: layers for name, layers in regions.items() if layers}

    def region_mean(self, layers: Sequence[int], metric: str) -> np.ndarray:
        """The mean over `layers` of their N x N `metric` matrices ("cosine", "distance" or
        "rms_distance"): the reference's pooling of a region."""
        return np.mean([getattr(self.layers[i], metric)() for i in layers], axis=0)


def _chunks(tensors: Sequence[TensorInfo], pool: SourcePool, size: int) -> Iterator[list]:
    """Float64 numpy arrays of `size` elements at a time, one per tensor (float32, float16 and
    bfloat16 decoded by numpy; float8 by torch, which numpy cannot decode)."""
    numel = tensors[0].numel
    if {t.dtype for t in tensors} <= CODEC_DTYPES:
        raw = [tensor_bytes(pool.get(t.file), t) for t in tensors]
        for start in range(0, numel, size):
            stop = min(start + size, numel)
            yield [
                decode(r[start:stop], t.dtype, np.float64)
                for r, t in zip(raw, tensors, strict=True)
            ]
        return
    import torch

    values = [tensor_values(pool.get(t.file), t) for t in tensors]
    for start in range(0, numel, size):
        # Copies, even of a float64 tensor: the experts' chunks become task vectors in place.
        yield [v[start : start + size].to(torch.float64, copy=True).numpy() for v in values]


def tensor_pair_sums(base: TensorInfo, experts: Sequence[TensorInfo], pool: SourcePool) -> PairSums:
    """Stream one tensor of BASE and of each expert; return their task vectors' sums."""
    n = len(experts)
    sums = PairSums.zeros(n, base.numel)
    for b, *chunk in _chunks([base, *experts], pool, max(2**16, _BUDGET // (n + 1))):
        for d in chunk:
            d -= b  # in place: the task vector's chunk
        for i in range(n):
            for j in range(i, n):
                sums.gram[i, j] += float(chunk[i].dot(chunk[j]))
                if j > i:
                    diff = chunk[i] - chunk[j]
                    sums.dist_sq[i, j] += float(diff.dot(diff))
    upper = np.triu_indices(n, 1)
    sums.gram[upper[::-1]] = sums.gram[upper]
    sums.dist_sq[upper[::-1]] = sums.dist_sq[upper]
    return sums


def _groups(base: Checkpoint, experts: Sequence[Checkpoint], report: SimilarityReport) -> list:
    """(base tensor, expert tensors) for every float tensor all inputs have, matched by name
    across layouts; of a grown vocabulary's tensors, the rows every input has."""
    labels = [f"expert {label}" for label in report.labels]
    matching = match(
        [*experts, base],
        [*labels, "base"],
        float_dtypes_may_differ=True,
        vocabulary=True,
        lonely="similarity leaves tensors without counterpart out and compares the rows all have",
    )
    groups = []
    for name, tensor in experts[0].tensors.items():
        partners = [matching.partner(name, i) for i in range(1, len(experts) + 1)]
        if any(p is None for p in partners) or not tensor.is_float or not tensor.numel:
            continue
        group = [partners[-1], tensor, *partners[:-1]]  # base first, then the experts in order
        if name in matching.rows:
            shared = matching.rows[name]
            report.shared_rows[name] = shared
            group = [t.rows(0, shared) for t in group]
        groups.append(group)
    return groups


def similarity(
    base: Checkpoint,
    experts: Sequence[Checkpoint],
    labels: Sequence[str],
    *,
    stack: str | None = None,
    quiet: bool = True,
) -> SimilarityReport:
    """Pairwise cosine similarity and L2 distance of the experts' task vectors (expert - BASE),
    per layer, per module kind and overall, in one streamed pass (each tensor of each input is
    read once). Layers and kinds follow the first expert's names.

    Raises:
        MismatchError: the checkpoints do not line up (dtypes may differ).
        LayerSpecError: `stack` names no stack of the first expert.
    """
    chosen = select_stack(experts[0].stacks, stack) if experts[0].stacks else None
    report = SimilarityReport(labels=list(labels), stack=chosen)
    report.total = PairSums.zeros(len(experts))
    groups = _groups(base, experts, report)
    bar = byte_progress(sum(g[1].nbytes for g in groups), "similarity", quiet)
    workers = ThreadPoolExecutor(current_threads())
    with SourcePool(openers([base, *experts])) as pool, bar, workers:
        pool.expect(groups)  # each group is read side by side, chunk by chunk
        # In order, so the report is the same whatever the number of cores.
        results = workers.map(lambda g: tensor_pair_sums(g[0], g[1:], pool), groups)
        for group, sums in zip(groups, results, strict=True):
            name = group[1].name
            kind = module_kind(name)
            report.total.add(sums)
            report.kinds.setdefault(kind, PairSums.zeros(len(experts))).add(sums)
            layer = stack_layer(name, chosen) if chosen is not None else None
            if layer is not None:
                report.layers.setdefault(layer, PairSums.zeros(len(experts))).add(sums)
                key = (layer, kind)
                report.layer_kinds.setdefault(key, PairSums.zeros(len(experts))).add(sums)
            bar.update(group[1].nbytes)
    report.layers = dict(sorted(report.layers.items()))
    return report
