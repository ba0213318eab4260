"""DARE sparsification: keep each element with probability `density` (then rescale by L1 norm,
mergekit's default for dare_*). Masks come from `chunk_rng`: reproducible, not mergekit's."""

from __future__ import annotations

import numpy as np

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

    def mask(self, start: int, delta: np.ndarray) -> np.ndarray:
        """Uniform draws below `density`."""
        seed, name, model = self.key
        draws = chunk_rng(seed, name, model, start).random(delta.shape[0], dtype=np.float32)
        return draws < np.float32(self.density)
