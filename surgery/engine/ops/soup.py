"""soup: the uniform or weighted average of several checkpoints ("model soup")."""

from __future__ import annotations

import math
from collections.abc import Sequence

from surgery.core.errors import SurgeryError
from surgery.engine.matching import match
from surgery.engine.naming import vocab_rows
from surgery.engine.ops.merge.equivalent import soup_config
from surgery.engine.ops.merge.vocabulary import (
    VocabularyMap,
    common_float,
    is_vocabulary_tensor,
    permuted,
)
from surgery.engine.plan import Plan, Source, blend_of, copy_of, require_equal_non_float
from surgery.engine.quantized import check_scales
from surgery.engine.reader import Checkpoint, openers
from surgery.engine.recipe import make_recipe
from surgery.engine.source import SourcePool


def parse_weights(text: str | None, count: int) -> list[float]:
    """Parse `--weights 1,2,1`: one non-negative number per expert, not all zero."""
    if text is None:
        return [1.0] * count
    try:
        weights = [float(part) for part in text.split(",")]
    except ValueError:
        raise SurgeryError(f"--weights {text!r}: give comma-separated numbers") from None
    if len(weights) != count:
        raise SurgeryError(f"--weights has {len(weights)} values for {count} checkpoints")
    check_weights(weights, text)
    return weights


def check_weights(weights: Sequence[float], text: str | None = None) -> None:
    """Weights must be finite, >= 0, not all zero, and sum to a finite total.

    Raises:
        SurgeryError: naming the weights.
    """
    shown = text if text is not None else ",".join(map(str, weights))
    if not all(math.isfinite(w) for w in weights) or not math.isfinite(sum(weights)):
        raise SurgeryError(f"--weights {shown!r}: every weight and their sum must be finite")
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise SurgeryError(f"--weights {shown!r}: weights must be >= 0 and not all zero")


def plan_soup(
    experts: Sequence[Checkpoint],
    weights: Sequence[float] | None = None,
    *,
    dtype: str | None = None,
    vocabulary: VocabularyMap | None = None,
) -> Plan:
    """Plan sum(w_i * expert_i) / sum(w_i) for every float tensor.

    Dividing once by the total (rather than pre-normalizing each weight) keeps a soup of identical
    checkpoints bit-identical to them for uniform or integer weights. Non-float tensors are
    copied from the first expert and must be identical in all. Experts may name their tensors in
    other layouts of one model (`surgery.engine.matching`); the output takes the first's. Every
    expert must hold every tensor, with one vocabulary, unless `vocabulary` (built from the
    tokenizers above the engine) lays every expert's embedding and head rows out on the output
    vocabulary.

    Raises:
        SurgeryError: fewer than two experts, or bad weights.
        MismatchError: the experts do not line up, or a non-float tensor differs.
    """
    if len(experts) < 2:
        raise SurgeryError("soup needs at least two checkpoints")
    weights = list(weights) if weights is not None else [1.0] * len(experts)
    check_weights(weights)
    labels = [f"expert {i + 1} ({e.path})" for i, e in enumerate(experts)]
    matching = match(
        experts,
        labels,
        float_dtypes_may_differ=dtype is not None,
        vocabulary=vocabulary is not None,
        vocabulary_hint="pass --tokenizer-source (union, base or a model)",
    )
    total = sum(weights)
    tensors = []
    with SourcePool(openers(experts)) as pool:
        scales = check_scales(matching, labels, pool, dtype=dtype, blended=experts[0].tensors)
        for name, first in experts[0].tensors.items():
            column = [matching.partner(name, i) for i in range(len(experts))]
            if vocabulary is not None and is_vocabulary_tensor(
                first, vocab_rows(experts[0].config)
            ):
                rows_dtype = common_float({t.dtype for t in column})  # the inputs', not --dtype
                column = [permuted(i, column, vocabulary, rows_dtype) for i in range(len(column))]
            if name in scales:  # identical in every expert (checked): never blended
                tensors.append(copy_of(first))
                continue
            if not first.is_float:
                require_equal_non_float(column, labels, pool)
                tensors.append(copy_of(first))
                continue
            sources = [Source(t, w) for t, w in zip(column, weights, strict=True) if w]
            tensors.append(blend_of(sources, dtype or first.dtype, divisor=total, name=name))
    roles = [f"expert{i + 1}" for i in range(len(experts))]
    recipe = make_recipe(
        "soup",
        list(zip(roles, experts, strict=True)),
        weights=list(weights),
        dtype=dtype,
        matching=matching.record(roles),
        tokenizer=vocabulary.record if vocabulary is not None else None,
    )
    exact = matching.exact and vocabulary is None
    return Plan(
        "soup",
        tensors,
        recipe,
        files_from=experts[0],
        inputs=list(experts),
        dtype=dtype,
        mergekit_config=soup_config(experts, weights, dtype) if exact else None,
        config_updates={} if vocabulary is None else {"vocab_size": vocabulary.size},
    )
