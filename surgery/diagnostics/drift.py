"""drift: how far TRAINED moved from BASE, per tensor, per layer and per module kind. Streamed.

relative L2 drift = ||theta - theta0|| / ||theta0||;
cosine = <theta, theta0> / (||theta|| ||theta0||).
Sums of squares and dot products accumulate in float64 over bounded chunks of the memory-mapped
inputs, so the whole model is never loaded; layers and kinds aggregate the sums, not the ratios.
float32, float16 and bfloat16 are decoded by numpy (exact; no torch import, which costs seconds
that a Hub read would spend with the link idle); float8 by torch. Tensors are summed side by side,
one per core.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from surgery.core.layers import Stack, select_stack, stack_layer
from surgery.core.threads import current_threads
from surgery.engine.float_codec import CODEC_DTYPES, decode
from surgery.engine.matching import match
from surgery.engine.progress import byte_progress
from surgery.engine.reader import Checkpoint, TensorInfo, openers
from surgery.engine.source import SourcePool
from surgery.engine.values import tensor_bytes, tensor_values

_CHUNK = 2**20  # elements per chunk

# Module kind from a tensor name; first match wins (norms before attention: `attention_norm`).
_KINDS = [
    ("norms", re.compile(r"norm|\bln_|layernorm|\.ln\d|_ln\b", re.I)),
    ("embeddings", re.compile(r"embed|\bwte\b|\bwpe\b|embeddings", re.I)),
    ("head", re.compile(r"lm_head|\.head\.|cls\.predictions|score\.", re.I)),
    ("attention", re.compile(r"attn|attention|q_proj|k_proj|v_proj|o_proj", re.I)),
    ("mlp", re.compile(r"mlp|feed_forward|ffn|intermediate|\.output\.dense|fc\d|experts", re.I)),
]


def module_kind(name: str) -> str:
    """attention, mlp, norms, embeddings, head or other, from a tensor name."""
    for kind, pattern in _KINDS:
        if pattern.search(name):
            return kind
    return "other"


@dataclass
class Sums:
    """Running sums from which drift and cosine follow; they add across tensors."""

    diff_sq: float = 0.0  # ||t - b||^2
    base_sq: float = 0.0  # ||b||^2
    trained_sq: float = 0.0  # ||t||^2
    dot: float = 0.0  # <t, b>
    numel: int = 0

    def add(self, other: Sums) -> None:
        """Accumulate another tensor's (or group's) sums."""
        self.diff_sq += other.diff_sq
        self.base_sq += other.base_sq
        self.trained_sq += other.trained_sq
        self.dot += other.dot
        self.numel += other.numel

    @property
    def relative_l2(self) -> float:
        """||t - b|| / ||b|| (inf when the base is all zeros and the tensor moved)."""
        if self.base_sq == 0:
            return 0.0 if self.diff_sq == 0 else math.inf
        return math.sqrt(self.diff_sq / self.base_sq)

    @property
    def cosine(self) -> float:
        """Cosine similarity between t and b (1 when both are zero)."""
        if self.base_sq == 0 or self.trained_sq == 0:
            return 1.0 if self.base_sq == self.trained_sq else 0.0
        return self.dot / math.sqrt(self.base_sq * self.trained_sq)


@dataclass
class DriftReport:
    """Drift per tensor, per layer of the chosen stack, and per module kind."""

    stack: Stack | None
    tensors: dict[str, Sums] = field(default_factory=dict)
    layers: dict[int, Sums] = field(default_factory=dict)
    kinds: dict[str, Sums] = field(default_factory=dict)
    layer_kinds: dict[tuple[int, str], Sums] = field(default_factory=dict)
    total: Sums = field(default_factory=Sums)
    # Tensors whose rows differ (a grown vocabulary) -> (rows compared, rows in TRAINED, in BASE):
    # only the rows both have are compared.
    shared_rows: dict[str, tuple[int, int, int]] = field(default_factory=dict)


def tensor_sums(base: TensorInfo, trained: TensorInfo, pool: SourcePool) -> Sums:
    """Stream one pair of tensors and return their sums."""
    sums = Sums(numel=base.numel)
    chunks = _numpy_chunks if {base.dtype, trained.dtype} <= CODEC_DTYPES else _torch_chunks
    for b, t in chunks(base, trained, pool):
        sums.base_sq += float(b.dot(b))
        sums.trained_sq += float(t.dot(t))
        sums.dot += float(t.dot(b))
        d = t - b
        sums.diff_sq += float(d.dot(d))
    return sums


def _numpy_chunks(base: TensorInfo, trained: TensorInfo, pool: SourcePool) -> Iterator[tuple]:
    """(base, trained) float64 arrays of `_CHUNK` elements at a time."""
    b_all = tensor_bytes(pool.get(base.file), base)
    t_all = tensor_bytes(pool.get(trained.file), trained)
    for start in range(0, base.numel, _CHUNK):
        stop = min(start + _CHUNK, base.numel)
        b = decode(b_all[start:stop], base.dtype, np.float64)
        yield b, decode(t_all[start:stop], trained.dtype, np.float64)


def _torch_chunks(base: TensorInfo, trained: TensorInfo, pool: SourcePool) -> Iterator[tuple]:
    """(base, trained) float64 tensors of `_CHUNK` elements at a time (float8, which numpy
    cannot decode)."""
    b_all = tensor_values(pool.get(base.file), base)
    t_all = tensor_values(pool.get(trained.file), trained)
    for start in range(0, base.numel, _CHUNK):
        yield b_all[start : start + _CHUNK].double(), t_all[start : start + _CHUNK].double()


def drift(
    base: Checkpoint, trained: Checkpoint, *, stack: str | None = None, quiet: bool = True
) -> DriftReport:
    """Measure drift of every float tensor of TRAINED from BASE, matched by name across layouts
    (`surgery.engine.matching`); of tensors whose rows differ (a grown vocabulary), the rows
    both have (named in `shared_rows`).

    Raises:
        MismatchError: the checkpoints do not line up (dtypes may differ).
    """
    matching = match(
        [trained, base],
        ["trained", "base"],
        float_dtypes_may_differ=True,
        vocabulary=True,
        lonely="drift leaves tensors without counterpart out and compares the rows both have",
    )
    chosen = select_stack(trained.stacks, stack) if trained.stacks else None
    report = DriftReport(stack=chosen)
    pairs = []
    for name, tensor in trained.tensors.items():
        theirs = matching.partner(name, 1)
        if theirs is None or not tensor.is_float or not tensor.numel:
            continue
        if name in matching.rows:  # a grown vocabulary: the rows both have
            shared = matching.rows[name]
            report.shared_rows[name] = (shared, tensor.shape[0], theirs.shape[0])
            tensor, theirs = tensor.rows(0, shared), theirs.rows(0, shared)
        pairs.append((theirs, tensor))
    bar = byte_progress(sum(t.nbytes for _, t in pairs), "drift", quiet)
    workers = ThreadPoolExecutor(current_threads())
    with SourcePool(openers([base, trained])) as pool, bar, workers:
        pool.expect(pairs)  # each pair is read side by side, chunk by chunk
        # numpy's reductions release the GIL: tensors side by side use every core. In order, so
        # the report is the same whatever the number of cores.
        for (_, t), sums in zip(
            pairs, workers.map(lambda p: tensor_sums(*p, pool), pairs), strict=True
        ):
            kind = module_kind(t.name)
            report.tensors[t.name] = sums
            report.total.add(sums)
            report.kinds.setdefault(kind, Sums()).add(sums)
            layer = stack_layer(t.name, chosen) if chosen is not None else None
            if layer is not None:
                report.layers.setdefault(layer, Sums()).add(sums)
                report.layer_kinds.setdefault((layer, kind), Sums()).add(sums)
            bar.update(t.nbytes)
    report.layers = dict(sorted(report.layers.items()))
    return report


def format_drift(report: DriftReport) -> str:
    """Per-layer and per-kind tables, plain text."""
    lines = [f"{'layer':>6}  {'rel. L2':>10}  {'cosine':>10}  params"]
    for layer, sums in report.layers.items():
        lines.append(f"{layer:>6}  {sums.relative_l2:>10.3e}  {sums.cosine:>10.6f}  {sums.numel}")
    lines += ["", f"{'kind':>10}  {'rel. L2':>10}  {'cosine':>10}  params"]
    for kind, sums in sorted(report.kinds.items()):
        lines.append(f"{kind:>10}  {sums.relative_l2:>10.3e}  {sums.cosine:>10.6f}  {sums.numel}")
    total = report.total
    lines.append(f"{'all':>10}  {total.relative_l2:>10.3e}  {total.cosine:>10.6f}  {total.numel}")
    for name, (shared, trained_rows, base_rows) in report.shared_rows.items():
        lines.append(
            f"note: {name} compared on the {shared} rows both have ({trained_rows} in trained, "
            f"{base_rows} in base)"
        )
    return "\n".join(lines)


def drift_rows(report: DriftReport) -> list[dict]:
    """One CSV row per tensor: name, layer, kind, relative L2, cosine, parameters compared and,
    for a grown vocabulary's tensors, the rows compared."""
    rows = []
    for name, sums in report.tensors.items():
        layer = stack_layer(name, report.stack) if report.stack is not None else None
        rows.append(
            {
                "tensor": name,
                "layer": "" if layer is None else layer,
                "kind": module_kind(name),
                "relative_l2": sums.relative_l2,
                "cosine": sums.cosine,
                "params": sums.numel,
                # A grown vocabulary's tensors: the rows compared (those both have).
                "shared_rows": report.shared_rows.get(name, ("",))[0],
            }
        )
    return rows


def write_drift_csv(report: DriftReport, path: Path) -> Path:
    """Write `drift_rows` as CSV (one row per tensor)."""
    rows = drift_rows(report)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["tensor"])
        writer.writeheader()
        writer.writerows(rows)
    return path


def plot_drift(report: DriftReport, path: Path, title: str) -> Path:
    """A PNG bar chart of relative L2 drift per layer and module kind."""
    from surgery.diagnostics.plots import plot_drift_by_layer

    values = {key: sums.relative_l2 for key, sums in report.layer_kinds.items()}
    return plot_drift_by_layer(values, path, title)
