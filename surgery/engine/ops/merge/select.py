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
                digits = part >> shift
                if shift + _BITS < width:  # the top digit needs no mask
                    digits &= (1 << _BITS) - 1
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

    def __init__(
        self, keys: Callable[[], Iterator[np.ndarray]], width: int, lo: int, hi: int, numel: int
    ) -> None:
        self.empty = hi <= lo
        self.lo, self.hi = lo, hi
        self.low = self.high = None  # None: no boundary on that side
        self.low_less = self.high_less = 0
        # Rank 0 and rank numel - 1 need no selection: every key lies on their inner side (TIES
        # keeps ranks [n - k, n): one boundary, one selection).
        wanted = {}
        if not self.empty and lo > 0:
            wanted["low"] = lo
        if not self.empty and hi < numel:
            wanted["high"] = hi - 1
        found = dict(zip(wanted, select_ranks(keys, width, list(wanted.values())), strict=True))
        self.low, self.low_less = found.get("low", (None, 0))
        self.high, self.high_less = found.get("high", (None, 0))
        self.reset()

    def reset(self) -> None:
        """Start a new pass."""
        self.seen_low = self.seen_high = 0

    def mask(self, keys: np.ndarray) -> np.ndarray:
        """Which elements of this chunk to keep."""
        if self.empty:
            return np.zeros(keys.shape, bool)
        keep = np.ones(keys.shape, bool)
        if self.low is not None:
            np.greater(keys, self.low, out=keep)
        if self.high is not None:
            keep &= keys < self.high
        # Keys equal to a boundary are kept by position among the equal ones (counted from the
        # first chunk); they are few, so only their indices are looked at.
        if self.low is not None:
            ties = np.flatnonzero(keys == self.low)
            first = self.lo - self.low_less - self.seen_low  # the first tie kept, in this chunk
            last = len(ties)
            if self.high == self.low:
                last = self.hi - self.high_less - self.seen_low
            keep[ties[max(0, first) : max(0, last)]] = True
            self.seen_low += len(ties)
        if self.high is not None and self.high != self.low:
            ties = np.flatnonzero(keys == self.high)
            keep[ties[: max(0, self.hi - self.high_less - self.seen_high)]] = True
            self.seen_high += len(ties)
        return keep


def ordered_keys(values: np.ndarray) -> np.ndarray:
    """Unsigned integers ordered like the (signed) values: the sign bit flipped for
    non-negative floats, every bit flipped for negative ones."""
    unsigned = np.uint32 if values.dtype == np.float32 else np.uint64
    bits = values.view(unsigned)
    top = unsigned(1) << unsigned(8 * values.itemsize - 1)
    return np.where(bits & top, ~bits, bits | top)


def key_value(key: int, dtype: type[np.floating]) -> float:
    """The float whose `ordered_keys` key is `key`."""
    unsigned = np.uint32 if dtype == np.float32 else np.uint64
    top = 1 << (8 * np.dtype(dtype).itemsize - 1)
    bits = key ^ top if key & top else ~key & (2 * top - 1)
    return np.array([bits], unsigned).view(dtype)[0]
