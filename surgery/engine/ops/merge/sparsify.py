"""What every sparsification (TIES, Breadcrumbs, DARE, DELLA) shares: a keep-mask per chunk and
mergekit's optional L1 rescaling, sum|delta| / sum|kept delta|, found in one more pass."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator

import numpy as np

# Below this L1 norm (before or after masking) mergekit does not rescale.
_RESCALE_EPS = 1e-7

# Starts a pass over (start, delta chunk) from element 0, or from the chunk at the given start.
Deltas = Callable[..., Iterator[tuple[int, np.ndarray]]]
# The deltas at given positions (a sample), or None where the inputs cannot be gathered from.
Sampled = Callable[[np.ndarray], np.ndarray | None]


class Sparsifier(ABC):
    """Drops elements of one model's delta (its task vector), chunk by chunk.

    `setup` runs the reduction passes; then `apply` masks any chunk, in any order.
    """

    def __init__(self, deltas: Deltas, numel: int, rescale: bool) -> None:
        self.deltas, self.numel, self.rescale = deltas, numel, rescale
        self.factor = 1.0

    def setup(self) -> None:
        """Find thresholds (`prepare`), then the rescaling factor if asked for."""
        self.prepare()
        if not self.rescale:
            return
        before = after = 0.0
        for start, delta in self.deltas():
            # Pairwise sums in the chunk's dtype (as mergekit's torch.sum), added up in float64:
            # an order of magnitude faster than summing in float64 or gathering the kept values.
            magnitude = np.abs(delta)
            before += float(np.add.reduce(magnitude))
            magnitude *= self.mask(start, delta)
            after += float(np.add.reduce(magnitude))
        if before >= _RESCALE_EPS and after >= _RESCALE_EPS:
            self.factor = before / after

    def apply(self, start: int, delta: np.ndarray) -> np.ndarray:
        """The kept (and rescaled) values of one chunk, in place; the others become 0."""
        kept = np.multiply(delta, self.mask(start, delta), out=delta)  # the caller's to change
        if self.factor != 1.0:
            kept *= delta.dtype.type(self.factor)
        return kept

    def prepare(self) -> None:  # noqa: B027 (optional hook)
        """Reduction passes before masking (thresholds); none by default."""

    @abstractmethod
    def mask(self, start: int, delta: np.ndarray) -> np.ndarray:
        """Which elements of the chunk starting at element `start` to keep."""


class KeepAll(Sparsifier):
    """density >= 1: mergekit returns the delta untouched (and does not rescale)."""

    def __init__(self, deltas: Deltas, numel: int) -> None:
        super().__init__(deltas, numel, rescale=False)

    def apply(self, start: int, delta: np.ndarray) -> np.ndarray:
        """The chunk itself."""
        return delta

    def mask(self, start: int, delta: np.ndarray) -> np.ndarray:
        """Everything."""
        return np.ones(delta.shape, bool)
