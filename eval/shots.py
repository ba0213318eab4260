"""Deterministic k-shot demonstrations that never include the evaluated item."""

from __future__ import annotations

import random
from collections.abc import Sequence


def draw_shots(candidates: Sequence[int], k: int, key: str) -> list[int]:
    """Draw `k` distinct demonstration indices from `candidates`, the same for the same key.

    The caller leaves the evaluated item (and anything identical to it) out of `candidates`;
    `key` names the task kind, seed and item, so each item gets its own demonstrations and a run
    with the same seed gets the same ones (Python's `random.Random` seeded with a string is
    stable across processes and platforms, unlike `hash()`).

    Args:
        candidates: indices allowed as demonstrations.
        k: how many to draw.
        key: e.g. ``"belebele/0/17"``.

    Returns:
        `k` indices, in the order they go into the prompt.

    Raises:
        ValueError: fewer than `k` candidates (callers check this first with a clearer message).
    """
    return random.Random(key).sample(list(candidates), k)
