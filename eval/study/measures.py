"""How each eval kind's per-item lines become summable statistics, and its metrics from sums.

Every metric `surgery compare` resamples is a function of per-item statistics summed over the
items drawn: accuracy is the mean of 0/1 outcomes, perplexity-type metrics are ratios of summed
log-likelihoods and token (word, byte) counts, corpus chrF is sacrebleu's formula on summed
sentence statistics. So a resample is a weighted sum (a row of a count matrix times the
statistics) and a metric is applied to sums.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from eval.errors import CompareError
from eval.study.chrf_stats import chrf_statistics, supports
from eval.study.results import UnitResult
from eval.study.stats import chrf_from_sums
from eval.tasks import KINDS

# Per-item 0/1 outcomes of the multiple-choice, probe and exact-match kinds, in the order reported.
OUTCOMES = ("acc", "acc_norm", "acc_bytes", "exact_match")
PPL_METRICS = ("ppl", "word_perplexity", "byte_perplexity", "bits_per_byte")
# Perplexities, whose changes read as ratios to the base (bits per byte is already a log).
RATIO_METRICS = ("ppl", "word_perplexity", "byte_perplexity")

Lines = list[dict[str, Any]]


@dataclass(frozen=True)
class Measure:
    """One kind's statistics and metrics.

    statistics: aligned lines of every (model, seed), flattened, to an array (runs, n, k).
    metrics: name -> function of sums (..., k) and the number of items n, giving values (...).
    higher: name -> whether a higher value is better.
    scale: how values are shown (`percent` for accuracies, else `raw`).
    """

    statistics: Callable[[list[Lines]], np.ndarray]
    metrics: dict[str, Callable[[np.ndarray, int], np.ndarray]]
    higher: dict[str, bool]
    scale: str


def _numbers(runs: list[Lines], keys: tuple[str, ...], unit: str) -> np.ndarray:
    try:
        return np.array([[[float(line[k]) for k in keys] for line in lines] for lines in runs])
    except (KeyError, TypeError, ValueError):
        raise CompareError(f"unit {unit}: samples lack numeric {', '.join(keys)}") from None


def _accuracy(keys: tuple[str, ...], unit: str) -> Measure:
    def metric(i: int):
        return lambda sums, n: 100.0 * sums[..., i] / n

    return Measure(
        statistics=lambda runs: _numbers(runs, keys, unit),
        metrics={key: metric(i) for i, key in enumerate(keys)},
        higher=dict.fromkeys(keys, True),
        scale="percent",
    )


def _perplexity(unit: str) -> Measure:
    keys = ("loglikelihood", "tokens", "words", "bytes")

    def ratio(i: int, exp: bool):
        def apply(sums: np.ndarray, n: int) -> np.ndarray:
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                nats = -sums[..., 0] / sums[..., i]
                return np.exp(nats) if exp else nats / math.log(2)

        return apply

    return Measure(
        statistics=lambda runs: _numbers(runs, keys, unit),
        metrics={
            "ppl": ratio(1, True),
            "word_perplexity": ratio(2, True),
            "byte_perplexity": ratio(3, True),
            "bits_per_byte": ratio(3, False),
        },
        higher=dict.fromkeys(PPL_METRICS, False),
        scale="raw",
    )


def _chrf(name: str, unit: str) -> Measure:
    from sacrebleu.metrics import CHRF

    metric = CHRF(word_order=2 if name == "chrf++" else 0)

    def statistics(runs: list[Lines]) -> np.ndarray:
        try:
            references = [line["reference"] for line in runs[0]]
            hypotheses = [[line["hypothesis"] for line in lines] for lines in runs]
        except KeyError:
            raise CompareError(f"unit {unit}: samples lack hypothesis or reference") from None
        for lines in runs[1:]:
            if [line["reference"] for line in lines] != references:
                raise CompareError(f"unit {unit}: references differ between results")
        if supports(metric):  # the same integers as sacrebleu's, for all models at once
            return chrf_statistics(hypotheses, references, metric.order).astype(np.float64)
        # References' n-grams are extracted once per unit, for every model.
        cached = CHRF(word_order=metric.word_order, references=[references])
        return np.array([cached._extract_corpus_statistics(h, None) for h in hypotheses], float)

    return Measure(
        statistics=statistics,
        metrics={name: lambda sums, n: chrf_from_sums(sums, metric)},
        higher={name: True},
        scale="raw",
    )


def _outcomes(unit: UnitResult, first_line: dict[str, Any]) -> Measure | None:
    keys = tuple(key for key in OUTCOMES if key in first_line)
    return _accuracy(keys, unit.id) if keys else None


# A kind's `measure` -> its statistics: 0/1 outcomes, summed log-likelihoods, chrF statistics.
MEASURES: dict[str, Callable[[UnitResult, dict[str, Any]], Measure | None]] = {
    "outcomes": _outcomes,
    "perplexity": lambda unit, first_line: _perplexity(unit.id),
    "chrf": lambda unit, first_line: _chrf(
        "chrf++" if "chrf++" in unit.metrics else "chrf", unit.id
    ),
}


def measure_for(kind: str, unit: UnitResult, first_line: dict[str, Any]) -> Measure | None:
    """The measure of a unit's kind, or None when its lines carry no per-item outcome.

    Args:
        kind: the unit's eval kind.
        unit: the unit's entry in results.json (its metric keys tell chrF from chrF++).
        first_line: its first samples line (which 0/1 outcomes a multiple-choice kind logs).
    """
    registered = KINDS.get(kind)
    return MEASURES[registered.measure if registered else "outcomes"](unit, first_line)


def primary_metric(kind: str, measure: Measure) -> str:
    """The metric shown in tables and plots for a kind: the kind's own (ppl, chrF), else the
    measure's first (the first accuracy)."""
    registered = KINDS.get(kind)
    preferred = registered.primary if registered else None
    return preferred if preferred in measure.metrics else next(iter(measure.metrics))
