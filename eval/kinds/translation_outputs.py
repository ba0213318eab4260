"""What a flores task's outputs look like: why generations stopped, empty outputs, lengths.

The reference (sanchit-ahuja/scaling-multilingual-experts, scripts/flores_layer_localization.py)
reports these beside chrF, because a model that runs on past its sentence, or stops before
writing one, scores badly for reasons chrF does not show. Computed from the logged outputs
(`surgery eval` per FLORES unit, `surgery compare` pooled over languages), so both agree.

This module imports neither torch nor transformers, and numpy only when it computes a quantile
(the CLI imports every kind's module).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Output length quantiles reported, in percent (the reference's).
QUANTILES = (50, 90, 95, 99)
# The rate of each stop reason (`eval.generation.STOPS`): a newline ends the line (truncation:
# what followed is cut), EOS, or the token limit.
STOP_RATES = {"newline": "truncation_rate", "eos": "eos_rate", "limit": "limit_rate"}
RATES = (*STOP_RATES.values(), "empty_rate")
DIAGNOSTICS = (*RATES, *(f"length_p{q}" for q in QUANTILES))


def length_quantile(lengths: Sequence[int], percent: int) -> int:
    """The reference's quantile: the sorted lengths' element at index round((n - 1) * q),
    rounding half to even (numpy's `nearest` method); 0 for no lengths."""
    import numpy as np

    if not lengths:
        return 0
    return int(np.quantile(np.asarray(lengths), percent / 100, method="nearest"))


def output_diagnostics(lines: Sequence[str], stops: Sequence[str | None]) -> dict[str, Any]:
    """Rates and length quantiles of scored outputs.

    Args:
        lines: the scored outputs (the hypotheses chrF reads).
        stops: why each generation stopped (`eval.generation.STOPS`); None where it was not
            logged (results written before it was), which leaves the stop rates None.

    Returns:
        ``truncation_rate``, ``eos_rate``, ``limit_rate`` (shares of generations that stopped at
        a newline, at EOS, at the token limit), ``empty_rate`` (empty outputs) and
        ``length_p50`` ... ``length_p99`` (output lengths in characters).
    """
    n = len(lines)
    logged = n > 0 and all(stop is not None for stop in stops)
    result: dict[str, Any] = {
        name: sum(stop == reason for stop in stops) / n if logged else None
        for reason, name in STOP_RATES.items()
    }
    result["empty_rate"] = sum(not line for line in lines) / n if n else None
    lengths = [len(line) for line in lines]
    result.update({f"length_p{q}": length_quantile(lengths, q) for q in QUANTILES})
    return result


def diagnostics_of_samples(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """`output_diagnostics` of logged samples (their `hypothesis` and `stop`)."""
    return output_diagnostics(
        [record["hypothesis"] for record in records], [record.get("stop") for record in records]
    )
