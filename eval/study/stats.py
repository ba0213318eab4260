"""The statistics of `surgery compare`: paired bootstrap by count matrices, corpus chrF from
summed sacrebleu statistics, percentile intervals and exact sign tests.

Every resample of a language is a row of a count matrix C (how often each item is drawn), so
a metric that is a function of summed per-item statistics is resampled for all models at once
by one matrix product C @ Y: no Python loop over resamples.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

TIE = 1e-9  # a sign test drops changes within this of 0


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


def resample_counts(rng: np.random.Generator, n: int, resamples: int) -> np.ndarray:
    """Count matrix of `resamples` bootstrap resamples of `n` items.

    The indices are drawn as sacrebleu's paired bootstrap draws them (`rng.choice(n, (B, n))`),
    then counted by one bincount, so the same generator gives the same resamples as sacrebleu.

    Returns:
        float64 array (resamples, n): row b holds how often each item is in resample b.
    """
    index = rng.choice(n, size=(resamples, n), replace=True)
    index += np.arange(resamples)[:, None] * n
    counts = np.bincount(index.ravel(), minlength=resamples * n)
    return counts.reshape(resamples, n).astype(np.float64)


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
