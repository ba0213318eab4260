"""What every sparsification (TIES, Breadcrumbs, DARE, DELLA) shares: a keep-mask per chunk and
mergekit's optional L1 rescaling, sum|delta| / sum|kept delta|, found in one more pass."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator

import numpy as np

from surgery.engine.ops.merge.arrays import Scratch

# Below this L1 norm (before or after masking) mergekit does not rescale.
_RESCALE_EPS = 1e-7

# Starts a pass over (start, delta chunk) from element 0, or from the chunk at the given start.
Deltas = Callable[..., Iterator[tuple[int, np.ndarray]]]
# The deltas at given positions (a sample), or None where the inputs cannot be gathered from.
Sampled = Callable[[np.ndarray], np.ndarray | None]


class Sparsifier(ABC):
    """Drops elements of one model's delta (its task vector), chunk by chunk.

    `prepare` finds thresholds; where `rescale`, `measure` then sees every chunk once, in any
    order and from any thread (the caller's pass, shared by the models), and `conclude` sets the
    factor from the norms added up in chunk order; then `apply` masks any chunk, in any order.

    `measure` keeps the mask of each chunk starting below `remember_below` (one bit per
    element), and `apply` uses it once instead of computing it again: for a mask that costs more
    than a pass to rebuild (DARE's draws, DELLA's ranks), where the caller applies every chunk
    once.
    """

    def __init__(self, deltas: Deltas, numel: int, rescale: bool) -> None:
        self.deltas, self.numel, self.rescale = deltas, numel, rescale
        self.factor = 1.0
        self.before = self.after = 0.0
        self.sums: dict[int, tuple[float, float]] = {}  # chunk start -> its L1 norms
        self.remember_below = 0  # masks of chunks starting below it are kept by `measure`
        self.masks: dict[int, np.ndarray] = {}  # chunk start -> packed mask, where remembered

    def measure(self, start: int, delta: np.ndarray, scratch: Scratch | None = None) -> None:
        """One chunk's L1 norms, before and after masking (the rescaling pass), kept for
        `conclude`; `scratch`: the caller's reused arrays."""
        # Pairwise sums in the chunk's dtype (as mergekit's torch.sum), added up in float64:
        # an order of magnitude faster than summing in float64 or gathering the kept values.
        out = None if scratch is None else scratch.get("magnitude", delta.dtype, len(delta))
        magnitude = np.abs(delta, out=out)
        before = float(np.add.reduce(magnitude))
        mask = self.mask(start, delta) if scratch is None else self.mask_into(start, delta, scratch)
        if start < self.remember_below:
            self.masks[start] = np.packbits(mask)
        magnitude *= mask
        self.sums[start] = (before, float(np.add.reduce(magnitude)))

    def conclude(self) -> None:
        """The rescaling factor, from the norms `measure` kept, added up in chunk order (the same
        float64 sums whatever order the chunks came in)."""
        for start in sorted(self.sums):
            before, after = self.sums[start]
            self.before += before
            self.after += after
        self.sums.clear()
        if self.before >= _RESCALE_EPS and self.after >= _RESCALE_EPS:
            self.factor = self.before / self.after

    def apply(self, start: int, delta: np.ndarray, scratch: Scratch | None = None) -> np.ndarray:
        """The kept (and rescaled) values of one chunk, in place; the others become 0.
        `scratch`: the caller's reused arrays, for the mask's temporaries."""
        packed = self.masks.pop(start, None)  # used once: freed as the map goes
        if packed is None:
            mask = (
                self.mask(start, delta)
                if scratch is None
                else self.mask_into(start, delta, scratch)
            )
        else:
            mask = np.unpackbits(packed, count=len(delta)).view(bool)
        kept = np.multiply(delta, mask, out=delta)  # the caller's to change
        if self.factor != 1.0:
            kept *= delta.dtype.type(self.factor)
        return kept

    def prepare(self) -> None:  # noqa: B027 (optional hook)
        """Reduction passes before masking (thresholds); none by default."""

    @abstractmethod
    def mask(self, start: int, delta: np.ndarray) -> np.ndarray:
        """Which elements of the chunk starting at element `start` to keep."""

    def mask_into(self, start: int, delta: np.ndarray, scratch: Scratch) -> np.ndarray:
        """`mask`, its temporaries and result taken from `scratch` where the method can."""
        return self.mask(start, delta)


class KeepAll(Sparsifier):
    """density >= 1: mergekit returns the delta untouched (and does not rescale)."""

    def __init__(self, deltas: Deltas, numel: int) -> None:
        super().__init__(deltas, numel, rescale=False)

    def apply(self, start: int, delta: np.ndarray, scratch: Scratch | None = None) -> np.ndarray:
        """The chunk itself."""
        return delta

    def mask(self, start: int, delta: np.ndarray) -> np.ndarray:
        """Everything."""
        return np.ones(delta.shape, bool)
