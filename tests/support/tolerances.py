"""The one tolerance of a log-likelihood against a reference, and what follows from it.

A float32 forward rounds differently with other shapes (batched, padded, from a prefix cache)
and on other CPUs, so a tolerance is set once, on what is computed (one item's log-likelihood),
and every figure computed from such items gets a tolerance derived from it, never one tuned to
the rounding of the machine the test was written on.
"""

from __future__ import annotations

from collections.abc import Sequence

# Most one item's log-likelihood (a choice's, a document's) may differ from a reference that
# scores it with other shapes. Measured on one CPU: up to 2.3e-5 (a 370-nat document against
# lm-eval) and 3.8e-6 (a 40-nat choice from the prefix cache: 4 float32 ulps). A scoring bug
# (a token missing or shifted) moves a score by far more.
LL_TOL = 1e-4


def near_tie(lls: Sequence[float], sizes: Sequence[int], tol: float = LL_TOL) -> bool:
    """Whether a choice other than the best is within `tol` per log-likelihood of it, once each
    is divided by its size (1, characters or bytes: acc, acc_norm, acc_bytes): then either may
    win under another rounding, and the item's outcome is not determined by the scores."""
    normed = [ll / n for ll, n in zip(lls, sizes, strict=True)]
    best = normed.index(max(normed))
    return any(
        normed[best] - value <= tol / sizes[best] + tol / n
        for j, (value, n) in enumerate(zip(normed, sizes, strict=True))
        if j != best
    )
