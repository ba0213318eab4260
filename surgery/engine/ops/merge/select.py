"""Exact rank selection over float magnitudes in chunked passes (radix selection).

A float's magnitude orders like its bit pattern read as an unsigned integer, so the element of a
given rank is found 16 bits at a time: each pass histograms the next 16 bits of the keys whose
higher bits match what is already known (2 passes for float32, 4 for float64). Nothing is ever
sorted and memory is one 65536-bucket histogram per target.

Ties are broken by position: among equal magnitudes the earlier element has the lower rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

_BITS = 16


def magnitude_keys(values: np.ndarray) -> np.ndarray:
    """Unsigned integers ordered like |values|."""
    unsigned = np.uint32 if values.dtype == np.float32 else np.uint64
    return np.abs(values).view(unsigned)


@dataclass
class _Target:
    rank: int  # rank still to find within the current prefix
    prefix: int = 0
    less: int = 0  # elements with a smaller key, found so far


def select_ranks(
    keys: Callable[[], Iterator[np.ndarray]], width: int, ranks: list[int]
) -> list[tuple[int, int]]:
    """The key of each ascending rank (0-based) and how many keys are smaller than it.

    Args:
        keys: starts a new pass over the key chunks each time it is called.
        width: bits per key (32 or 64).
        ranks: ranks to find, each in [0, number of keys).

    Returns:
        (key, count of smaller keys) per rank.
    """
    targets = [_Target(rank) for rank in ranks]
    for shift in range(width - _BITS, -1, -_BITS):
        hists = [np.zeros(1 << _BITS, np.int64) for _ in targets]
        for chunk in keys():
            for target, hist in zip(targets, hists, strict=True):
                part = chunk
                if shift + _BITS < width:
                    part = chunk[(chunk >> (shift + _BITS)) == target.prefix]
                digits = ((part >> shift) & ((1 << _BITS) - 1)).astype(np.intp)
                hist += np.bincount(digits, minlength=1 << _BITS)
        for target, hist in zip(targets, hists, strict=True):
            cumulative = np.cumsum(hist)
            bucket = int(np.searchsorted(cumulative, target.rank, side="right"))
            below = int(cumulative[bucket - 1]) if bucket else 0
            target.less += below
            target.rank -= below
            target.prefix = (target.prefix << _BITS) | bucket
    return [(t.prefix, t.less) for t in targets]


class RankRange:
    """Keeps exactly the elements of ascending ranks [lo, hi), ties broken by position.

    `mask` must see the chunks in order, from the first, once per pass (`reset` starts a pass).
    """

    def __init__(self, keys: Callable[[], Iterator[np.ndarray]], width: int, lo: int, hi: int):
        self.empty = hi <= lo
        self.lo, self.hi = lo, hi
        if not self.empty:
            (self.low, self.low_less), (self.high, self.high_less) = select_ranks(
                keys, width, [lo, hi - 1]
            )
        self.reset()

    def reset(self) -> None:
        """Start a new pass."""
        self.seen_low = self.seen_high = 0

    def mask(self, keys: np.ndarray) -> np.ndarray:
        """Which elements of this chunk to keep."""
        if self.empty:
            return np.zeros(keys.shape, bool)
        keep = (keys > self.low) & (keys < self.high)
        at_low, at_high = keys == self.low, keys == self.high
        # Position among the elements equal to the boundary key, counted from the first chunk.
        low_pos = np.cumsum(at_low) - 1 + self.seen_low
        high_pos = np.cumsum(at_high) - 1 + self.seen_high
        low_ok = at_low & (low_pos >= self.lo - self.low_less)
        high_ok = at_high & (high_pos < self.hi - self.high_less)
        if self.low == self.high:
            keep |= low_ok & high_ok
        else:
            keep |= low_ok | high_ok
        self.seen_low += int(at_low.sum())
        self.seen_high += int(at_high.sum())
        return keep
