"""What kind of number a metric is, from its name: which way is better, and on which scale a
difference is judged. One table for localize, sweep and the demo.

Names are eval's: `<task>[/<lang or subtask>]/<leaf>`; the leaf says the kind.
"""

from __future__ import annotations

import math

# exp(mean NLL): judged on the log scale, where they are the mean NLL itself (so a perplexity and
# the matching bits per byte, one a monotone function of the other, get the same verdict).
PERPLEXITIES = frozenset({"ppl", "perplexity", "word_perplexity", "byte_perplexity"})
# Lower is better; any other metric (acc, acc_norm, chrf, f1, exact_match...) is higher-better.
LOWER_IS_BETTER = PERPLEXITIES | {"bits_per_byte", "loss", "nll"}
# Means of 0/1 items: their standard error is binomial when eval reports none (copain).
PROPORTIONS = frozenset({"acc", "acc_norm", "acc_bytes", "exact_match"})
STDERR_SUFFIX = "_stderr"
# Shares of a translation task's outputs (eval.kinds.translation_outputs.RATES): how generations
# stopped and how many are empty. Reported beside the scores, never scored, plotted or localized
# as one (nothing says which way is better, and their noise is not a score's).
OUTPUT_RATES = frozenset({"truncation_rate", "eos_rate", "limit_rate", "empty_rate"})


def leaf(metric: str) -> str:
    """The last part of a metric's name: `ppl/eng/bits_per_byte` -> `bits_per_byte`."""
    return metric.rsplit("/", 1)[-1]


def is_perplexity(metric: str) -> bool:
    """Whether a metric is a perplexity (plotted on a log axis, judged on the log scale)."""
    return leaf(metric) in PERPLEXITIES


def lower_is_better(metric: str) -> bool:
    """Whether a lower value of the metric is better (perplexities, bits per byte, losses)."""
    return leaf(metric) in LOWER_IS_BETTER


def is_stderr(metric: str) -> bool:
    """Whether a column is a standard error (`acc_stderr`), not a metric of its own."""
    return metric.endswith(STDERR_SUFFIX)


def is_output_rate(metric: str) -> bool:
    """Whether a column describes translation outputs (`OUTPUT_RATES`), not a score."""
    return leaf(metric) in OUTPUT_RATES


def judged(metric: str, value: float) -> float:
    """The value on the scale differences are judged on: log for a perplexity, else as is."""
    if not is_perplexity(metric):
        return value
    return math.log(value) if value > 0 else math.nan


def judged_stderr(metric: str, value: float, stderr: float) -> float:
    """A standard error carried to the judged scale (delta method: d log x = dx / x)."""
    return stderr / value if is_perplexity(metric) else stderr
