"""DARE sparsification: keep each element with probability `density` (then rescale by L1 norm,
mergekit's default for dare_*). Masks come from `chunk_rng`: reproducible, not mergekit's."""

from __future__ import annotations

import numpy as np

from surgery.engine.ops.merge.arrays import Scratch
from surgery.engine.ops.merge.kernel import chunk_rng
from surgery.engine.ops.merge.sparsify import Deltas, Sparsifier


class Dare(Sparsifier):
    """A Bernoulli(density) mask per element, drawn per chunk from (seed, name, model, start)."""

    def __init__(
        self,
        deltas: Deltas,
        numel: int,
        rescale: bool,
        density: float,
        key: tuple[int, str, int],
    ) -> None:
        super().__init__(deltas, numel, rescale)
        self.density, self.key = density, key

    def mask_into(self, start: int, delta: np.ndarray, scratch: Scratch) -> np.ndarray:
        """`mask`, its result in `scratch`."""
        return self.mask(start, delta, scratch.get("mask", bool, len(delta)))

    def mask(self, start: int, delta: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Uniform 32-bit draws below density * 2**32 (the generator's raw 64-bit outputs, two
        draws each: 3x cheaper than drawing floats; P(keep) is within 2**-32 of `density`)."""
        seed, name, model = self.key
        count = delta.shape[0]
        raw = chunk_rng(seed, name, model, start).bit_generator.random_raw((count + 1) // 2)
        threshold = min(round(self.density * 2**32), 2**32 - 1)
        return np.less(raw.view(np.uint32)[:count], np.uint32(threshold), out=out)
