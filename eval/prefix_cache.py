"""The token prefix most contexts of a task share, encoded once and reused by every batch.

With ``first_n`` demonstrations every Belebele item but the first k starts with the same k
demonstrations, about two thirds of its tokens. `encode_shared_prefix` runs that prefix once per
task and keeps its keys and values; `SharedPrefix.for_batch` lays them out for a batch so that
only the rest of each context runs.

Exactness. The prefix is a common prefix of the *token ids* that are scored (BOS, truncation
and tokens merged across the demonstration/item boundary included), so each context's own ids
are unchanged. A batch keeps today's layout: contexts left-padded to one
width, real tokens contiguous, so every mask computed from column indices (causal, sliding
window) is the one the whole-context forward sees. Column ``c`` of row ``r`` holds context token
``c - pad_r``; the first ``length`` columns come from the prefix's cache (a key at position
``i`` depends only on tokens ``0..i``, all shared), the rest run. Rows padded by more than the
others re-run a few prefix tokens: batches hold contexts of similar length, so these are few.
The cache is kept whole in every layer (a plain `DynamicCache`, no sliding-window cropping),
which is what lets any row read any prefix position.

Past the prefix, items can share more: Belebele asks most passages two questions.
`shared_groups` finds such groups among the items that start with the prefix; scoring runs a
group's shared tokens once per batch (eval.scoring).

Where the model's cache is not a plain per-layer key/value cache (recurrent or linear-attention
layers), or the contexts share nothing, `encode_shared_prefix` returns None and scoring runs
whole contexts as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch

from eval.model_loading import cache_argument, model_device, supports_logits_to_keep

# Fewest tokens past the shared prefix that contexts must share to run them once per group: a
# group costs a second forward, which a few tokens do not pay for.
MIN_GROUP_TOKENS = 8


@dataclass(frozen=True)
class SharedPrefix:
    """A token prefix, the contexts that start with it (`members`), its keys and values.

    `layers` holds one `(keys, values)` pair per layer, each `[1, heads, length, head_dim]`
    (None for a layer that stores nothing, e.g. one reading another layer's cache).
    """

    length: int
    members: list[int]
    layers: list[tuple[torch.Tensor | None, torch.Tensor | None]]

    def for_batch(self, mask: torch.Tensor) -> Any:
        """A cache of the first `length` columns of a left-padded batch of members.

        Row r's context starts after its padding; column c holds the key/value of its token
        ``c - pad_r`` (a prefix token, since every context is longer than the prefix). Columns
        still in the padding hold the first token's: masked out, only finite.
        """
        pads = (mask == 0).sum(-1, keepdim=True)  # [rows, 1]
        columns = torch.arange(self.length, device=mask.device)
        index = (columns - pads).clamp(min=0)  # [rows, length]
        return _cache([(_gather(k, index), _gather(v, index)) for k, v in self.layers])

    def expanded(self, rows: int) -> Any:
        """A cache of the prefix for `rows` rows that all start with it: views of its keys and
        values, nothing copied (the forward's cache update copies them once)."""
        return _cache([(_expand(k, rows), _expand(v, rows)) for k, v in self.layers])


def _cache(layers: list[tuple[torch.Tensor | None, torch.Tensor | None]]) -> Any:
    """A `DynamicCache` holding these keys and values as they are.

    Built from empty slices, then given the tensors: built from the tensors, it would copy
    each of them once more.
    """
    from transformers import DynamicCache

    cache = DynamicCache([(_empty(k), _empty(v)) for k, v in layers])
    for layer, (keys, values) in zip(cache.layers, layers, strict=True):
        if keys is not None:
            layer.keys, layer.values = keys, values
    return cache


def _empty(states: torch.Tensor | None) -> torch.Tensor | None:
    return None if states is None else states[..., :0, :]


def _expand(states: torch.Tensor | None, rows: int) -> torch.Tensor | None:
    return None if states is None else states.expand(rows, -1, -1, -1)


def _gather(states: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor | None:
    """Per row, the sequence positions `index[row]` of `states` (`[1, heads, length, dim]`)."""
    if states is None:
        return None
    _, heads, _, dim = states.shape
    rows = index.shape[0]
    expanded = index.to(states.device)[:, None, :, None].expand(rows, heads, -1, dim)
    return states.expand(rows, -1, -1, -1).gather(2, expanded)


def shared_prefix(contexts: Sequence[Sequence[int]]) -> tuple[int, list[int]]:
    """The token prefix that saves the most tokens when run once, and who starts with it.

    Saved tokens are ``length x (contexts starting with it - 1)``. Contexts sorted by their ids
    put those sharing a prefix next to each other, so the best prefix is the largest rectangle
    under the common lengths of neighbours (a stack, one pass). With ``first_n``
    demonstrations, the first k items (whose demonstrations skip themselves) are left out and
    the other items share all k demonstrations.

    Returns:
        `(length, indices of the contexts that start with it)`; `(0, [])` if nothing is shared.
        Every such context keeps at least one token after the prefix: its last position
        predicts a choice's first token, so it runs in the batch.
    """
    order = sorted(range(len(contexts)), key=lambda i: list(contexts[i]))
    common = [_common_length(contexts[a], contexts[b]) for a, b in pairwise(order)]
    best = (0, 0, 0)  # (tokens saved, first pair, end pair): pairs [first, end) of `common`
    stack: list[tuple[int, int]] = []  # (first pair, length), lengths increasing
    for end, length in enumerate([*common, 0]):
        first = end
        while stack and stack[-1][1] >= length:
            first, height = stack.pop()
            best = max(best, (height * (end - first), first, end))
        stack.append((first, length))
    saved, first, end = best
    if saved == 0:
        return 0, []
    return min(common[first:end]), order[first : end + 1]


def shared_groups(
    contexts: Sequence[Sequence[int]], prefix: int, members: Sequence[int], most: int
) -> list[tuple[list[int], int]]:
    """Members in groups of at most `most` that share tokens past the prefix (one passage asked
    several questions), each with the number of tokens its contexts share.

    Contexts sorted by their ids put those sharing tokens next to each other; a neighbour joins
    the group before it while that saves tokens (``(size - 1) x shared past the prefix`` does
    not drop) and it shares at least `MIN_GROUP_TOKENS` past the prefix.

    Returns:
        `(indices, length)` per group: the contexts start with the same `length` tokens and keep
        at least one of their own. A context alone has all of its tokens but the last.
    """
    order = sorted(members, key=lambda i: list(contexts[i]))
    groups: list[tuple[list[int], int]] = []
    run, length = [order[0]], len(contexts[order[0]]) - 1
    for a, b in pairwise(order):
        common = _common_length(contexts[a], contexts[b])
        shared = min(length, common) - prefix
        saves = len(run) * shared >= (len(run) - 1) * (length - prefix)
        if len(run) < most and shared >= MIN_GROUP_TOKENS and saves:
            run.append(b)
            length = prefix + shared
        else:
            groups.append((run, length))
            run, length = [b], len(contexts[b]) - 1
    groups.append((run, length))
    return groups


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of `a` and `b`, at most one less than the shorter."""
    limit = max(min(len(a), len(b)) - 1, 0)
    return next((i for i in range(limit) if a[i] != b[i]), limit)


def plain_attention_cache(model: Any) -> bool:
    """Whether the model's cache holds plain keys and values per layer and token."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    if getattr(model, "_is_stateful", False):
        return False
    # Anything else (linear-attention or recurrent states, compressed caches): whole contexts.
    plain = (DynamicLayer, DynamicSlidingWindowLayer)
    return all(type(layer) in plain for layer in DynamicCache(config=model.config).layers)


def sliding_window_layers(model: Any) -> bool:
    """Whether some layer of the model attends only within a window (of columns)."""
    from transformers.cache_utils import DynamicCache, DynamicSlidingWindowLayer

    layers = DynamicCache(config=model.config).layers
    return any(type(layer) is DynamicSlidingWindowLayer for layer in layers)


@torch.no_grad()
def encode_shared_prefix(model: Any, contexts: Sequence[Sequence[int]]) -> SharedPrefix | None:
    """Run the contexts' shared token prefix once and keep its keys and values.

    Args:
        model: a causal LM in eval mode.
        contexts: every context's token ids (as scored).

    Returns:
        The prefix (the one saving most tokens, `shared_prefix`) and its cache, or None where
        nothing is shared or the model's cache is not plain keys and values (callers then run
        whole contexts).
    """
    from transformers import DynamicCache

    length, members = shared_prefix(contexts)
    if length == 0 or not plain_attention_cache(model):
        return None
    device = model_device(model)
    ids = torch.tensor([list(contexts[members[0]][:length])], device=device)
    # No config: every layer a full DynamicLayer, so sliding-window layers keep every position.
    cache = DynamicCache()
    extra = {"logits_to_keep": 1} if supports_logits_to_keep(model) else {}
    model(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        position_ids=torch.arange(length, device=device)[None],
        use_cache=True,
        **{cache_argument(model): cache},
        **extra,
    )
    layers = [(layer.keys, layer.values) for layer in cache.layers]
    if not layers or any(k is not None and k.shape[-2] != length for k, _ in layers):
        return None
    return SharedPrefix(length, members, layers)
