"""A suite's items split once, by a seed, into a search half and a report half.

`surgery search` chooses on the search half and reports on the other, so the scores it reports
come from items the choice never saw; `surgery eval --suite --half report` rescores any model on
the same items. Each unit's items that serve as no other item's few-shot demonstration (the
task's `half_items`: FLORES with its demonstrations from the dev split, Belebele's items after
its first_n demonstrations, every perplexity document) are shuffled by a generator keyed by the
seed and the unit, and cut in two: the search half gets the extra item of an odd count. The
demonstrations are in neither half. Few-shot seed copies of a unit share its halves.

This module imports neither torch nor transformers.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from eval.errors import TaskSpecError

HALVES = ("search", "report")


def unit_key(unit_id: str) -> str:
    """The unit without its few-shot seed (`belebele/ces_Latn/seed=2` -> `belebele/ces_Latn`):
    every seed's copy of a unit scores the same items."""
    return unit_id.split("/seed=")[0]


def split_items(items: Sequence[int], seed: int, key: str) -> tuple[list[int], list[int]]:
    """`(search, report)`: `items` shuffled by a generator of `seed` and `key`, cut in two,
    each half sorted. Python's `random.Random` seeded with a string is the same in every process
    and on every platform."""
    order = list(items)
    random.Random(f"halves/{seed}/{key}").shuffle(order)
    cut = (len(order) + 1) // 2
    return sorted(order[:cut]), sorted(order[cut:])


def half_of(
    task: object, unit_id: str, half: str, split_seed: int, limit: int | None, seed: int
) -> frozenset[int]:
    """The indices of one unit's items in `half` (search or report).

    Args:
        task: the unit's loaded task (its `half_items` names the items a half may hold).
        unit_id: the unit's id (its key, without few-shot seed, keys the shuffle).
        half: `search` or `report`.
        split_seed: the seed of the split.
        limit, seed: the eval settings (the first `limit` items; `seed` draws demonstrations).

    Raises:
        TaskSpecError: the task's kind cannot be split, or it has fewer than two such items.
    """
    if half not in HALVES:
        raise TaskSpecError(f"half {half!r}: use search or report")
    items = getattr(task, "half_items", None)
    if items is None:
        kind = getattr(getattr(task, "spec", None), "kind", type(task).__name__)
        raise TaskSpecError(f"unit {unit_id}: {kind} tasks cannot be split into halves")
    free = items(limit, seed)
    if len(free) < 2:
        raise TaskSpecError(
            f"unit {unit_id}: {len(free)} item(s) serve as no demonstration; two halves need 2"
        )
    search, report = split_items(free, split_seed, unit_key(unit_id))
    return frozenset(search if half == "search" else report)
