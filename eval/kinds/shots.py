"""k-shot demonstrations: lm-evaluation-harness's two samplers, and our own seeded draw.

- ``first_n`` (lm-eval's FirstNSampler, Belebele's config): the first k rows of the file that
  are not the evaluated row; when demonstrations do not come from the evaluated split (a config
  that names no few-shot split, as Global-PIQA's), lm-eval takes the first k rows as they are,
  so the first k items are among their own demonstrations.
- ``default`` (lm-eval's ContextSampler, Global-PIQA's config): one `random.Random(fewshot_seed)`
  advanced item by item in file order, ``rnd.sample(rows, k)``; when asked to exclude the item
  it draws k + 1 and drops the evaluated row (lm-eval does so only when demonstrations come from
  the evaluated split; Global-PIQA's config names no few-shot split, so there an item can be
  its own demonstration).
- ``random`` (this project's earlier default): for each item its own draw keyed by the run's
  seed and the item index, never the item itself; independent of `--limit` and of order.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

SAMPLERS = ("first_n", "default", "random")


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


def choose_shots(
    docs: Sequence[Any],
    count: int,
    k: int,
    sampler: str,
    *,
    fewshot_seed: int = 1234,
    exclude_self: bool = True,
    key: str = "",
) -> list[list[int]]:
    """Demonstration indices for each of the first `count` docs.

    Args:
        docs: every row of the file (compared with ``==``, as lm-eval compares its rows).
        count: how many docs are evaluated (the first `count`).
        k: demonstrations per doc.
        sampler: ``first_n``, ``default`` or ``random`` (see the module docstring).
        fewshot_seed: seed of lm-eval's ``default`` sampler (its ``--fewshot_random_seed``).
        exclude_self: never the evaluated doc (``default``: draw k + 1 and drop it), as lm-eval
            does when demonstrations come from the evaluated split; ``random`` always excludes it.
        key: ``random`` only: task kind and run seed, e.g. ``"belebele/0"``.

    Returns:
        One list of indices into `docs` per evaluated doc, in prompt order.
    """
    if k == 0:
        return [[] for _ in range(count)]
    if sampler == "first_n":
        if not exclude_self:
            return [list(range(k)) for _ in range(count)]
        return [[j for j in range(len(docs)) if docs[j] != docs[i]][:k] for i in range(count)]
    if sampler == "random":
        return [
            draw_shots([j for j in range(len(docs)) if j != i], k, f"{key}/{i}")
            for i in range(count)
        ]
    rnd = random.Random(fewshot_seed)
    chosen = []
    for i in range(count):
        if not exclude_self:
            chosen.append(rnd.sample(range(len(docs)), k))
            continue
        picks = [j for j in rnd.sample(range(len(docs)), k + 1) if docs[j] != docs[i]][:k]
        if len(picks) < k:  # duplicates of the doc were drawn: lm-eval redraws without them
            pool = [j for j in range(len(docs)) if docs[j] != docs[i]]
            picks = rnd.sample(pool, k)
        chosen.append(picks)
    return chosen
