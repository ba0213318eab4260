"""Independent forward passes on a CPU's cores, one batch per core rather than one at a time.

A batch of a small model on a CPU spends much of its time in element-wise operations (norms,
rotary embeddings, activations, cache copies) that torch splits across its threads and joins
after each one: a few hundred joins per forward, each waiting for the slowest thread. Batches
that do not depend on each other (scored items) can instead run side by side, each on its own
share of the threads: the same operations on the same shapes, with no join between batches.

On a GPU (one stream) or with one thread, batches run in order in the calling thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")


def map_batches(fn: Callable[[T], R], batches: Sequence[T], device: torch.device) -> Iterator[R]:
    """`fn` of each batch, in order; on a CPU with several threads, batches run concurrently.

    Each of ``min(threads, batches)`` workers gets ``threads // workers`` of torch's threads
    for the call (restored after). `fn` runs under `torch.inference_mode` in every thread
    (grad mode is per thread). Workers hold one batch each: peak memory grows with them.
    """
    threads = torch.get_num_threads()
    workers = min(threads, len(batches)) if device.type == "cpu" else 1
    if workers <= 1:
        for batch in batches:
            with torch.inference_mode():
                yield fn(batch)
        return

    def run(batch: T) -> R:
        with torch.inference_mode():
            return fn(batch)

    # Threads started after set_num_threads take the new count: set it before the pool starts.
    torch.set_num_threads(threads // workers)
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="surgery-score") as pool:
            yield from pool.map(run, batches)
    finally:
        torch.set_num_threads(threads)
