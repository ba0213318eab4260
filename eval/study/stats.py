"""The statistics of `surgery compare`: paired bootstrap by count matrices, corpus chrF from
summed sacrebleu statistics, percentile intervals and exact sign tests.

Every resample of a language is a row of a count matrix C (how often each item is drawn), so
a metric that is a function of summed per-item statistics is resampled for all models at once
by matrix products C @ Y, a block of rows of C at a time (bounded memory whatever the
number of items): no Python loop over single resamples.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

TIE = 1e-9  # a sign test drops changes within this of 0
ALPHA = 0.05  # the level of every verdict: 95% intervals, Benjamini-Hochberg's false discovery rate
# A change resting on fewer items (in some language it averages) is never called significant:
# the percentile interval is too narrow for few items (it resamples their spread, which
# underestimates the variance by (n - 1) / n, and small samples are skewed). Simulated with
# nothing changed (paired normal, t(3) and 0/1 differences, B = 2,000, 2,000 trials each),
# 95% intervals excluded 0 in 24% of trials at n = 3, 11-12% at 10, 7.5% at 20 and 6-7% at 30
# (5% intended).
MIN_ITEMS = 30


def cell_seed(seed: int, key: str) -> np.random.SeedSequence:
    """The seed of one language's resamples, from the run's seed and the cell's name.

    Each (task, variant, language) gets its own stream, so languages are resampled
    independently of each other and of the order in which they are computed. sacrebleu's
    paired bootstrap takes it as its `seed` and then draws the same resamples.
    """
    words = np.frombuffer(hashlib.sha256(key.encode()).digest()[:16], dtype=np.uint32)
    return np.random.SeedSequence([seed, *words.tolist()])


def cell_rng(seed: int, key: str) -> np.random.Generator:
    """The generator of one language's resamples (see `cell_seed`)."""
    return np.random.default_rng(cell_seed(seed, key))


# Items x resamples drawn at once: the indices, their counts and the float64 count matrix are
# 8 MiB each, whatever the number of items (a whole matrix is 24 x B x n bytes: 4.5 GiB at
# B = 10,000 and n = 20,000).
BLOCK = 2**20


def count_blocks(
    rng: np.random.Generator, n: int, resamples: int, block: int | None = None
) -> Iterator[np.ndarray]:
    """Consecutive rows of the count matrix of `resamples` bootstrap resamples of `n` items.

    The indices are drawn as sacrebleu's paired bootstrap draws them (`rng.choice(n, (B, n))`),
    a block of rows at a time: a Generator's bounded integers come from one stream whatever the
    size of each call, so the rows are those of one (B, n) draw (a test checks it), and the same
    generator gives the same resamples as sacrebleu.

    Yields:
        float64 arrays (rows, n), `rows` at most max(1, block // n) (block: BLOCK by default):
        row b holds how often each item is in that resample.
    """
    rows = max(1, (block or BLOCK) // max(n, 1))
    for start in range(0, resamples, rows):
        size = min(rows, resamples - start)
        index = rng.choice(n, size=(size, n), replace=True)
        index += np.arange(size)[:, None] * n  # row b counts into bins b*n .. b*n + n - 1
        counts = np.bincount(index.ravel(), minlength=size * n)
        yield counts.reshape(size, n).astype(np.float64)


def resample_counts(rng: np.random.Generator, n: int, resamples: int) -> np.ndarray:
    """The whole count matrix (resamples, n) of `count_blocks`: for small n only."""
    return np.concatenate(list(count_blocks(rng, n, resamples)))


def resampled_sums(
    rng: np.random.Generator, values: np.ndarray, resamples: int, block: int | None = None
) -> np.ndarray:
    """Per resample, the sums of `values` (n, k) over the items drawn: C @ values, a block of
    count rows at a time, so memory stays bounded whatever n is.

    Sums of integer statistics (outcomes, counts) are exact; float sums (log-likelihoods) may
    differ from one whole product in their last bits, as BLAS sums in another order for
    another matrix shape (as it does on another CPU).

    Returns:
        float64 array (resamples, k).
    """
    sums = np.empty((resamples, values.shape[1]))
    start = 0
    for counts in count_blocks(rng, len(values), resamples, block):
        sums[start : start + len(counts)] = counts @ values
        start += len(counts)
    return sums


def percentile_interval(values: np.ndarray) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles (numpy's linear interpolation) of resampled values."""
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def chrf_from_sums(sums: np.ndarray, metric) -> np.ndarray:
    """sacrebleu's corpus chrF from summed sentence statistics, for many sums at once.

    The same formula as `CHRF._compute_f_score` (effective-order averaging, or eps smoothing
    when the metric has it), on the last axis of `sums`, so that 10,000 resamples cost a few
    array operations instead of 10,000 calls; tests check it against sacrebleu's own.

    Args:
        sums: array (..., 3 * metric.order) of [hyp, ref, match] counts per n-gram order, as
            `CHRF._extract_corpus_statistics` gives them per sentence, summed over sentences.
        metric: the `sacrebleu.metrics.CHRF` that extracted them.

    Returns:
        chrF in 0..100, shape sums.shape[:-1].
    """
    stats = np.asarray(sums, dtype=np.float64).reshape(*np.shape(sums)[:-1], metric.order, 3)
    hyp, ref, match = stats[..., 0], stats[..., 1], stats[..., 2]
    eps, factor = 1e-16, metric.beta**2
    with np.errstate(divide="ignore", invalid="ignore"):
        prec = np.where(hyp > 0, match / hyp, eps)
        rec = np.where(ref > 0, match / ref, eps)
        denom = factor * prec + rec
        f_score = np.where(denom > 0, (1 + factor) * prec * rec / denom, eps)
        if metric.eps_smoothing:
            return 100 * f_score.sum(-1) / metric.order
        valid = (hyp > 0) & (ref > 0)
        effective = valid.sum(-1)
        avg_prec = np.where(effective > 0, np.where(valid, prec, 0).sum(-1) / effective, 0.0)
        avg_rec = np.where(effective > 0, np.where(valid, rec, 0).sum(-1) / effective, 0.0)
        top = (1 + factor) * avg_prec * avg_rec
        bottom = factor * avg_prec + avg_rec
        return np.where(bottom > 0, 100 * top / bottom, 0.0)


def bootstrap_p(changes: np.ndarray) -> float:
    """Two-sided p-value of a change from its paired bootstrap resamples.

    The smallest level at which the equal-tailed percentile interval excludes 0: twice the
    share of resampled changes on the far side of 0 (0 counted on both sides), with Davison and
    Hinkley's +1 so that B resamples never give 0:
    min(1, 2 * (1 + min(#{d <= 0}, #{d >= 0})) / (B + 1)).
    """
    changes = np.asarray(changes, dtype=np.float64)
    far = min(int(np.sum(changes <= 0)), int(np.sum(changes >= 0)))
    return min(1.0, 2.0 * (1 + far) / (len(changes) + 1))


def adjust_bh(p_values: list[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (q), scipy's `false_discovery_control`: a cell
    with q < 0.05 is a discovery at a 5% false discovery rate over the cells adjusted together."""
    from scipy.stats import false_discovery_control

    if not p_values:
        return []
    return [float(q) for q in false_discovery_control(np.asarray(p_values), method="bh")]


def smallest_sign_test_p(units: int) -> float:
    """The smallest two-sided p an exact sign test over `units` languages or families can give
    (every unit a win): 2 / 2^units, capped at 1 (0.0625 for 5, so never below 0.05)."""
    return min(1.0, 2.0 * 0.5**units) if units else 1.0


@dataclass(frozen=True)
class SignTest:
    """Wins and losses against the base over languages or families, and the exact p-value."""

    wins: int
    losses: int
    ties: int
    p: float


def sign_test(changes: np.ndarray | list[float], higher_is_better: bool) -> SignTest:
    """Exact two-sided binomial sign test of changes from the base.

    Args:
        changes: one change (model - base) per language or family.
        higher_is_better: whether a positive change is a win (accuracy, chrF) or a loss (ppl).

    Returns:
        Wins, losses, ties (|change| <= 1e-9, dropped) and scipy's `binomtest` p (1.0 when
        every change is a tie).
    """
    from scipy.stats import binomtest

    changes = np.asarray(changes, dtype=np.float64)
    sign = 1.0 if higher_is_better else -1.0
    wins = int(np.sum(sign * changes > TIE))
    losses = int(np.sum(sign * changes < -TIE))
    ties = len(changes) - wins - losses
    p = binomtest(wins, wins + losses, 0.5).pvalue if wins + losses else 1.0
    return SignTest(wins, losses, ties, float(p))
