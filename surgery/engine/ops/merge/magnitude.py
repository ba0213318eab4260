"""TIES sparsification: keep the `density` fraction of largest magnitudes (at least one).

The threshold is found exactly (surgery/engine/ops/merge/select.py: in memory, in a sampled
window or by radix selection), never by sorting the tensor; mergekit sorts it whole
(torch.argsort).
"""

from __future__ import annotations

import numpy as np

from surgery.engine.ops.merge.arrays import Scratch
from surgery.engine.ops.merge.select import RankRange, magnitude_keys, sample_positions
from surgery.engine.ops.merge.sparsify import Deltas, Sampled, Sparsifier


class Magnitude(Sparsifier):
    """Keeps the k = max(1, int(density * n)) largest |delta| (ties broken by position)."""

    def __init__(
        self, deltas: Deltas, numel: int, rescale: bool, density: float, sampled: Sampled
    ) -> None:
        super().__init__(deltas, numel, rescale)
        self.density, self.sampled = density, sampled

    def keep_range(self) -> tuple[int, int]:
        """Ascending ranks kept."""
        if self.density <= 0 or self.numel == 0:
            return 0, 0
        k = max(1, int(self.density * self.numel))
        return self.numel - k, self.numel

    def prepare(self) -> None:
        """Select the boundary magnitudes."""
        width = 64 if self._is_double() else 32
        lo, hi = self.keep_range()
        keys = lambda start: ((s, magnitude_keys(d, d)) for s, d in self.deltas(start))  # noqa: E731
        positions = sample_positions(self.numel, width)
        sample = None if positions is None else self.sampled(positions)
        sample = None if sample is None else magnitude_keys(sample)
        self.range = RankRange(keys, width, lo, hi, self.numel, sample)

    def _is_double(self) -> bool:
        first = next(self.deltas(), None)  # None: an empty tensor, no chunks (any width works)
        return first is not None and first[1].dtype == np.float64

    def mask(self, start: int, delta: np.ndarray) -> np.ndarray:
        """Elements whose rank is in the kept range."""
        return self.range.mask(magnitude_keys(delta), start)

    def mask_into(self, start: int, delta: np.ndarray, scratch: Scratch) -> np.ndarray:
        """`mask`, its keys and result in `scratch`."""
        keys = magnitude_keys(delta, scratch.get("keys", delta.dtype, len(delta)))
        count = len(delta)
        return self.range.mask(
            keys, start, scratch.get("mask", bool, count), scratch.get("spare", bool, count)
        )
