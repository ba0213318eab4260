"""DELLA sparsification (MAGPRUNE): within each row, keep an element with a probability that
grows with its magnitude rank, from density - epsilon (smallest) to density + epsilon (largest).

Ranks are per row (the last dimension; a 1-D tensor is one row), as in mergekit, so only a row is
ever sorted. Masks come from `chunk_rng`: reproducible, not mergekit's.

Ranking and drawing a mask costs far more than the rest of the merge, and L1 rescaling needs
every mask of a tensor before its map can start. So the rescaling pass keeps the masks it draws,
as bits (`KEPT_BYTES` per tensor), for the map to read back instead of drawing them again; and it
runs in the tensor's own map jobs (`SharedPass`), not with the shard's other reductions, so that
only the tensors being written hold masks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from surgery.engine.ops.merge.arrays import Inputs
from surgery.engine.ops.merge.kernel import chunk_rng
from surgery.engine.ops.merge.sparsify import Deltas, Sparsifier

# Bytes of masks a tensor keeps from its rescaling pass for its map (1 bit per element and
# model): a 32000 x 2048 embedding's for three models (25 MB) fit. Past them (from the chunk
# where the tensor's kept bits reach the bound on), the map draws its masks again.
KEPT_BYTES = 32 * 2**20


class Della(Sparsifier):
    """Rank-dependent Bernoulli masks; chunks hold whole rows of length `row`."""

    def __init__(
        self,
        deltas: Deltas,
        numel: int,
        rescale: bool,
        density: float,
        epsilon: float,
        row: int,
        key: tuple[int, str, int],
    ) -> None:
        super().__init__(deltas, numel, rescale)
        self.density, self.epsilon, self.row, self.key = density, epsilon, row, key

    def mask(self, start: int, delta: np.ndarray) -> np.ndarray:
        """Rank each row's magnitudes and draw the keep-mask of the chunk at `start` (whole
        rows)."""
        rows = np.abs(delta).reshape(-1, self.row)
        order = _stable_order(rows)
        order += np.arange(0, len(delta), self.row)[:, None]  # flat positions
        work = delta.dtype.type
        # Rank 0..row-1 scaled to [0, 1], as mergekit's (rank - min) / (max - min), and the
        # probability of each rank, computed once for a row (elementwise: the same floats as
        # for every element), then scattered to where each rank lies.
        scaled = np.arange(self.row).astype(delta.dtype) / work(max(self.row - 1, 1))
        by_rank = work(self.density - self.epsilon) + scaled * work(2 * self.epsilon)
        probs = np.empty(len(delta), delta.dtype)
        probs[order] = by_rank
        seed, name, model = self.key
        draws = chunk_rng(seed, name, model, start).random(len(delta), dtype=delta.dtype)
        return draws < probs


class SharedPass:
    """One tensor's rescaling pass, run by the tensor's map jobs: each job that starts takes the
    next chunk not yet taken until none is left, then waits for the chunks others are measuring;
    the last one concludes. A large tensor's pass thus runs on every worker that reaches it, and
    a tensor's kept masks live only while it is being written.

    `measure(inputs, start)` measures the chunk at `start` for every sparsifier in `rescaling`.
    """

    def __init__(
        self,
        sparsifiers: list[Sparsifier],
        rescaling: Sequence[Sparsifier],
        starts: range,
        measure: Callable[[Inputs, int], None],
    ) -> None:
        self.sparsifiers, self.rescaling = sparsifiers, list(rescaling)
        self.starts, self.measure = starts, measure
        keep = KEPT_BYTES * 8 // max(1, len(self.rescaling))  # elements per model
        for sparsifier in self.rescaling:
            sparsifier.remember_below = keep
        self.cond = threading.Condition()
        self.taken = self.running = 0
        self.done = False
        self.error: BaseException | None = None

    def result(self, inputs: Inputs) -> list[Sparsifier]:
        """The sparsifiers, rescaling factors set: measures chunks until none is left to take,
        then waits for the others' (raising the error of any job that failed)."""
        while (start := self._take()) is not None:
            try:
                self.measure(inputs, start)
            except BaseException as error:
                self._release(error)
                raise
            self._release(None)
        with self.cond:
            self.cond.wait_for(lambda: self.error is not None or not self.running)
            if self.error is not None:
                raise self.error
            if not self.done:
                for sparsifier in self.rescaling:
                    sparsifier.conclude()
                self.done = True
        return self.sparsifiers

    def _take(self) -> int | None:
        with self.cond:
            if self.error is not None:
                raise self.error
            if self.taken == len(self.starts):
                return None
            self.taken += 1
            self.running += 1
            return self.starts[self.taken - 1]

    def _release(self, error: BaseException | None) -> None:
        with self.cond:
            self.running -= 1
            self.error = self.error or error
            self.cond.notify_all()


def _stable_order(rows: np.ndarray) -> np.ndarray:
    """`np.argsort(rows, axis=1, kind="stable")`, for float32 magnitudes 6x faster: each key is
    the magnitude's bits followed by the column, all distinct, so a plain (SIMD) sort of the
    keys gives the stable order and the columns come back from the keys' low bits."""
    if rows.dtype != np.float32:
        return np.argsort(rows, axis=1, kind="stable")
    bits = max(1, (rows.shape[1] - 1).bit_length())
    keys = rows.view(np.uint32).astype(np.uint64)
    keys <<= np.uint64(bits)
    keys |= np.arange(rows.shape[1], dtype=np.uint64)
    keys.sort(axis=1)
    keys &= np.uint64((1 << bits) - 1)
    return keys.view(np.int64)  # the columns, below 2**63: the same integers, no copy
