"""Exact rank selection over float keys (magnitudes or signed values), found three ways.

A float's magnitude orders like its bit pattern read as an unsigned integer, so selection works on
integer keys. The key of a given rank is found:
- in memory, where the tensor's keys fit `WHOLE_BYTES`: one pass gathers them, then a window
  (below) from a strided sample of them, compared in memory; where it misses, one
  `ndarray.partition` (linear) of a copy finds every rank;
- else in a window, where a sample of the keys is given: the sample bounds a narrow range of keys
  around each rank, one pass counts the keys below it and keeps those inside, and a partition of
  those finds the rank (a sample that misses falls back to the next way);
- else by radix selection: each pass histograms the next 16 bits of the keys whose higher bits
  match what is already known (2 passes for float32, 4 for float64).
All three give the same key, the count of smaller keys and the count of equal ones.

Ties are broken by position: among equal keys the earlier element has the lower rank. A
`RankRange` turns the rank range kept into key bounds and, where only some of the keys tied at a
bound are kept, the position of the first one kept (low bound) or dropped (high bound), found
in the one chunk that holds it (counts of tied keys per chunk come with a window): masks then
depend on a chunk and its position alone, so any segment of a tensor can be masked on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

_BITS = 16
# Keys of a tensor held at once for an in-memory selection (per selection, so per worker): a
# 2048 x 2048 projection's float32 keys (16 MB) fit. Larger tensors take a window, as fast (one
# pass either way) in a few % of the memory.
WHOLE_BYTES = 16 * 2**20
# Keys a window may hold (beyond them, radix selection): at most a few % of the tensor's.
WINDOW_BYTES = 16 * 2**20
# Sampled keys that bound a window (a stratified sample, see `sample_positions`).
SAMPLE_SIZE = 2**16
# Half-width of a window, in standard deviations of a sample rank (sqrt(m p (1 - p))), plus a
# few sample ranks for the smallest p: a miss (then radix selection) is rarer than 1 in 10^6.
_WINDOW_SIGMAS, _WINDOW_SLACK = 6.0, 16

# Starts a pass over (start, key chunk) in order from element `start` (a chunk's start).
Keys = Callable[[int], Iterator[tuple[int, np.ndarray]]]


@dataclass(frozen=True)
class Found:
    """The key of one rank, how many keys are smaller, and how many equal it; where known, the
    chunks' starts and how many keys equal it in each (so a tie is found without a pass)."""

    key: int
    less: int
    equal: int
    ties: tuple[np.ndarray, np.ndarray] | None = None


def magnitude_keys(values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Unsigned integers ordered like |values| (written into `out`, of the values' dtype,
    where given)."""
    unsigned = np.uint32 if values.dtype == np.float32 else np.uint64
    return np.abs(values, out=out).view(unsigned)


def sample_positions(numel: int, width: int, in_memory: bool = True) -> np.ndarray | None:
    """Where to sample a tensor of `numel` elements for a window: one random position in each of
    `SAMPLE_SIZE` equal strata (fixed, so selections never depend on a seed), or None where the
    tensor's keys are selected in memory anyway (`in_memory`: those that fit `WHOLE_BYTES`) or
    it is too small to sample."""
    if (in_memory and numel * width // 8 <= WHOLE_BYTES) or numel < 4 * SAMPLE_SIZE:
        return None
    starts = np.arange(SAMPLE_SIZE, dtype=np.int64) * numel // SAMPLE_SIZE
    widths = np.diff(np.append(starts, numel))
    return starts + np.random.default_rng(0).integers(0, widths)


def count_slack(count: int, m: int, scale: float) -> int:
    """Sample ranks by which a rank estimated from `count` of a sample of `m` (a count over
    the whole tensor, scaled by `scale`) may miss: `_WINDOW_SIGMAS` standard deviations of the
    count, taken as at least 16 for a count near 0 (for a `Deferred` window)."""
    q = min(0.5, (count + 16) / m)
    return int(_WINDOW_SIGMAS * scale * np.sqrt(m * q * (1 - q))) + 1


def select_ranks(
    keys: Keys, width: int, ranks: list[int], numel: int, sample: np.ndarray | None = None
) -> list[Found]:
    """The key of each ascending rank (0-based), with its counts of smaller and equal keys.

    Args:
        keys: starts a new pass over the key chunks, in order, each time it is called.
        width: bits per key (32 or 64).
        ranks: ranks to find, each in [0, numel).
        numel: how many keys `keys` yields in all.
        sample: keys at `sample_positions(numel, width)`, for a window; None: no window.
    """
    if not ranks:
        return []
    if numel * width // 8 <= WHOLE_BYTES:
        return _in_memory(keys, width, ranks, numel)
    found = None if sample is None else _in_window(keys, np.sort(sample), ranks, numel)
    return found if found is not None else _radix(keys, width, ranks)


def _in_memory(keys: Keys, width: int, ranks: list[int], numel: int) -> list[Found]:
    """The keys gathered in order (one pass), then a window around each rank from a strided
    sample of them (compares in memory); a rank outside its window is found in a copy."""
    whole = np.empty(numel, np.uint32 if width == 32 else np.uint64)
    starts = []
    for start, chunk in keys(0):
        whole[start : start + len(chunk)] = chunk
        starts.append(start)
    bounds = [*starts[1:], numel]

    def again(first: int = 0) -> Iterator[tuple[int, np.ndarray]]:
        for start, stop in zip(starts, bounds, strict=True):
            if start >= first:
                yield start, whole[start:stop]

    sample = np.sort(whole[np.arange(min(SAMPLE_SIZE, numel)) * numel // min(SAMPLE_SIZE, numel)])
    found = _in_window(again, sample, ranks, numel)
    if found is not None:
        return found
    ordered = whole.copy()
    ordered.partition(sorted(set(ranks)))
    found = []
    for rank in ranks:
        key = ordered[rank]
        counts = np.array([np.count_nonzero(c == key) for _, c in again()])
        less = int(np.count_nonzero(ordered < key))
        found.append(Found(int(key), less, int(counts.sum()), (np.array(starts), counts)))
    return found


@dataclass(frozen=True)
class Deferred:
    """Ranks known only once a pass is done (they depend on a count it makes): `ranks` gives
    them then; the window is bounded around estimates, `slack` sample ranks wider."""

    ranks: Callable[[], list[int]]
    slack: int


def _in_window(
    keys: Keys, sample: np.ndarray, ranks: list[int], numel: int, deferred: Deferred | None = None
) -> list | None:
    """One pass keeping the keys between two sampled keys around each rank; None where a rank
    falls outside its window (or the windows would hold more than `WINDOW_BYTES`, the pass
    then left unfinished). `deferred`: `ranks` are estimates, the exact ones come from it."""
    m = len(sample)
    slack = _WINDOW_SLACK + (deferred.slack if deferred else 0)
    bounds = []
    for rank in ranks:
        p = min(max(rank / numel, 0.0), 1.0)
        margin = int(_WINDOW_SIGMAS * np.sqrt(m * p * (1 - p))) + slack
        estimate = int(p * m)
        lo = sample[estimate - margin] if estimate - margin >= 0 else None
        hi = sample[estimate + margin] if estimate + margin < m else None
        bounds.append((lo, hi))
    limit = WINDOW_BYTES // sample.itemsize
    below, kept, held, starts = [0] * len(ranks), [[] for _ in ranks], 0, []
    inside = above = np.empty(0, bool)  # reused from chunk to chunk (no page faults)
    for start, chunk in keys(0):
        starts.append(start)
        if len(inside) < len(chunk):
            inside, above = np.empty(len(chunk), bool), np.empty(len(chunk), bool)
        for i, (lo, hi) in enumerate(bounds):
            within = inside[: len(chunk)]
            if lo is None:
                within[...] = True
            else:
                np.greater_equal(chunk, lo, out=within)
                below[i] += len(chunk) - int(np.count_nonzero(within))
            if hi is not None:
                within &= np.less_equal(chunk, hi, out=above[: len(chunk)])
            kept[i].append(chunk[np.flatnonzero(within)])  # 2x faster than a bool index
            held += len(kept[i][-1])
        if held > limit:
            return None
    ranks = deferred.ranks() if deferred else ranks
    found = []
    for rank, count, parts in zip(ranks, below, kept, strict=True):
        window = np.concatenate(parts) if parts else sample[:0]
        if not count <= rank < count + len(window):
            return None
        window.partition(rank - count)
        key = window[rank - count]
        ties = np.array([np.count_nonzero(part == key) for part in parts])
        less = count + int(np.count_nonzero(window < key))
        found.append(Found(int(key), less, int(ties.sum()), (np.array(starts), ties)))
    return found


@dataclass
class _Target:
    rank: int  # rank still to find within the current prefix
    prefix: int = 0
    less: int = 0  # elements with a smaller key, found so far
    equal: int = 0


def _radix(keys: Keys, width: int, ranks: list[int]) -> list[Found]:
    targets = [_Target(rank) for rank in ranks]
    for shift in range(width - _BITS, -1, -_BITS):
        hists = [np.zeros(1 << _BITS, np.int64) for _ in targets]
        for _, chunk in keys(0):
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
            target.equal = int(hist[bucket])
            target.prefix = (target.prefix << _BITS) | bucket
    return [Found(t.prefix, t.less, t.equal) for t in targets]


def locate(keys: Keys, found: Found, index: int) -> int:
    """The position of the `index`-th (0-based) key equal to `found.key`: in the one chunk that
    holds it where the counts per chunk are known, else in a pass that stops there."""
    first = seen = 0
    if found.ties is not None:
        starts, counts = found.ties
        total = np.cumsum(counts)
        at = int(np.searchsorted(total, index, side="right"))
        first, seen = int(starts[at]), int(total[at - 1]) if at else 0
    for start, chunk in keys(first):
        ties = np.flatnonzero(chunk == chunk.dtype.type(found.key))
        if seen + len(ties) > index:
            return start + int(ties[index - seen])
        seen += len(ties)
    raise ValueError(f"no key {found.key} of index {index}")


class RankRange:
    """Keeps exactly the elements of ascending ranks [lo, hi), ties broken by position.

    Kept: keys strictly between the bounds `low` and `high` (a bound of None keeps that side
    whole), keys equal to `low` from position `low_from` on, keys equal to `high` before position
    `high_to` (a position bound of a tie kept whole is 0 or `numel`).
    """

    def __init__(
        self,
        keys: Keys,
        width: int,
        lo: int,
        hi: int,
        numel: int,
        sample: np.ndarray | None = None,
        found: list[Found] | None = None,
    ) -> None:
        """`found`: the ranks' keys already selected (those of lo, then of hi - 1, where they
        need one), else None."""
        self.empty, self.numel = hi <= lo, numel
        self.low = self.high = None  # None: no boundary on that side
        self.low_from, self.high_to = 0, numel
        # Rank 0 and rank numel - 1 need no selection: every key lies on their inner side (TIES
        # keeps ranks [n - k, n): one boundary, one selection).
        wanted = {}
        if not self.empty and lo > 0:
            wanted["low"] = lo
        if not self.empty and hi < numel:
            wanted["high"] = hi - 1
        if found is None:
            found = select_ranks(keys, width, [*wanted.values()], numel, sample)
        found = dict(zip(wanted, found, strict=True))
        if "low" in found:
            low = found["low"]
            self.low = _typed(low.key, width)
            if lo > low.less:  # the ties before rank lo are dropped
                self.low_from = locate(keys, low, lo - low.less)
        if "high" in found:
            high = found["high"]
            self.high = _typed(high.key, width)
            if hi - high.less < high.equal:  # the ties from rank hi on are dropped
                self.high_to = locate(keys, high, hi - high.less)

    def _sides(self, start: int, stop: int) -> tuple[bool, bool, set]:
        """For the chunk [start, stop): whether keys equal to the low bound are all kept, the
        same for the high bound, and the bounds whose tied keys are kept by position."""
        # Keys equal to a bound are kept whole where the chunk lies wholly on the kept side of
        # that bound's tie position (>= and <=), dropped whole where it lies wholly on the other
        # side (> and <); only the one chunk holding the position looks at positions.
        low_all = self.low_from <= start and self.low != self.high
        high_all = self.high_to >= stop and self.low != self.high
        low_none = self.low_from >= stop and self.low != self.high
        high_none = self.high_to <= start and self.low != self.high
        partial = {self.low, self.high} - {None}
        partial -= {self.low} if low_all or low_none else set()
        partial -= {self.high} if high_all or high_none else set()
        return low_all, high_all, partial

    def positional(self, start: int, stop: int) -> bool:
        """Whether the mask of the chunk [start, stop) depends on the keys' positions in it
        (it holds a tie position); elsewhere it is elementwise, in any order of the keys."""
        return not self.empty and bool(self._sides(start, stop)[2])

    def mask(
        self,
        keys: np.ndarray,
        start: int,
        out: np.ndarray | None = None,
        spare: np.ndarray | None = None,
        stop: int | None = None,
    ) -> np.ndarray:
        """Which elements of the chunk of `keys` at element `start` to keep (in `out`, a bool
        array as long, where given; `spare`, another, for a comparison with the high bound).

        `stop`: the end of the chunk where `keys` are some of its keys, in any order (a chunk
        not `positional`); by default `start + len(keys)`."""
        keep = np.empty(keys.shape, bool) if out is None else out
        if self.empty:
            keep[...] = False
            return keep
        stop = start + len(keys) if stop is None else stop
        low_all, high_all, partial = self._sides(start, stop)
        if self.low is not None:
            (np.greater_equal if low_all else np.greater)(keys, self.low, out=keep)
        else:
            keep[...] = True
        if self.high is not None:
            keep &= (np.less_equal if high_all else np.less)(keys, self.high, out=spare)
        # Keys equal to a bound are kept by position; they are few, so only their indices are
        # looked at.
        for bound in partial:
            ties = np.flatnonzero(keys == bound)
            first = self.low_from - start if bound == self.low else 0
            last = self.high_to - start if bound == self.high else len(keys)
            keep[ties[np.searchsorted(ties, first) : np.searchsorted(ties, last)]] = True
        return keep


def _typed(key: int, width: int) -> np.unsignedinteger:
    return (np.uint32 if width == 32 else np.uint64)(key)


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
