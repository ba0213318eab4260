"""The prompt pass of greedy generation: a left-padded batch's KV cache and next tokens.

On a CPU the prompt pass runs at the speed of the matrix products, so what it can save is
tokens: padding, and prefixes several prompts share. Rows run in parts of similar length
(little padding). Prompts that start with the same tokens (few-shot prompts that drew the same
first demonstration) run them once: the shared keys and values are copied to each row, and
the rest of each prompt runs after them. Each row's cache is laid out as its prompt, the
shared prefix first, then masked columns up to its group's longest prompt, then the rest of
its prompt; the mask returned says which columns are real.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch

from eval.model_loading import cache_argument, model_device, supports_logits_to_keep

# Tokens (rows x width) each part of a batch's prompts runs at once: rows of similar length
# together, so little of the prompt pass computes padding (batches are sorted longest first).
PREFILL_TOKENS = 512
# Fewest tokens prompts must share to run them once: a demonstration, not a task's first words
# (one more forward costs about what a dozen tokens do).
SHARED_TOKENS = 16
# Most rows one shared prefix runs for (bounds the search for groups).
MOST_SHARING = 64


@dataclass
class Part:
    """Some rows of a batch, run: their keys and values per layer, mask and next tokens."""

    rows: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    mask: torch.Tensor
    predicted: list[list[int]]


def prefill(
    model: Any, ids: torch.Tensor, mask: torch.Tensor
) -> tuple[Any, list[list[int]], torch.Tensor]:
    """Run a left-padded batch's prompts: its KV cache, each row's greedy next token, and the
    cache's attention mask (`mask`, or with masked columns after a shared prefix).

    A model whose cache keeps every key (`full_attention`) runs prompts sharing at least
    `SHARED_TOKENS` first tokens from one run of them (`shared_groups`), and the other rows in
    parts of about `PREFILL_TOKENS` tokens, each part only as wide as its longest prompt. Each
    part's keys and values are padded on the left to the batch's width (masked columns, as
    padding is).
    """
    from transformers import DynamicCache

    config = model.config.get_text_config(decoder=True)
    if not full_attention(DynamicCache(config=config)):
        cache, predicted = run_prompts(model, ids, mask, DynamicCache(config=config))
        return cache, predicted, mask
    prompts = [row[keep.bool()].tolist() for row, keep in zip(ids, mask, strict=True)]
    groups = shared_groups(prompts)
    grouped = {row for rows, _ in groups for row in rows}
    rest = [row for row in range(len(prompts)) if row not in grouped]
    step = max(1, PREFILL_TOKENS // ids.shape[1])
    if not groups and step >= len(rest):  # one forward: the batch as it is
        cache, predicted = run_prompts(model, ids, mask, DynamicCache(config=config))
        return cache, predicted, mask
    parts = [_shared_part(model, prompts, rows, shared) for rows, shared in groups]
    for start in range(0, len(rest), step):
        parts.append(_part(model, ids, mask, rest[start : start + step]))
    return _assemble(parts, ids.shape[1])


def shared_groups(prompts: list[list[int]]) -> list[tuple[list[int], int]]:
    """Groups of rows whose prompts share at least `SHARED_TOKENS` first tokens: `(rows,
    shared)`, `shared` the tokens all of a group's rows share (each row keeps at least one token
    of its own: its prediction is the next token).

    In token order, prompts sharing a prefix are neighbours. Of the ways to cut that order into
    runs of neighbours, the groups are the one that saves the most tokens: a group of k rows
    saves its shared tokens k - 1 times, less the padding its rests need (each as long as its
    longest).
    """
    order = sorted(range(len(prompts)), key=lambda row: prompts[row])
    lengths = [len(prompts[row]) for row in order]
    common = [
        min(_common_length(prompts[a], prompts[b]), len(prompts[a]) - 1, len(prompts[b]) - 1)
        for a, b in itertools.pairwise(order)
    ]
    # best[end]: the most tokens saved among the first `end` rows; start[end]: its last group's
    # first row (None: the row `end - 1` is in no group).
    best, start = [0] * (len(order) + 1), [None] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        best[end] = best[end - 1]
        shared, longest, total = 1 << 62, lengths[end - 1], lengths[end - 1]
        for first in range(end - 2, max(-1, end - 1 - MOST_SHARING), -1):
            shared = min(shared, common[first])
            if shared < SHARED_TOKENS:
                break
            longest, total = max(longest, lengths[first]), total + lengths[first]
            rows = end - first
            saved = best[first] + (rows - 1) * shared - (rows * longest - total)
            if saved > best[end]:
                best[end], start[end] = saved, first
    groups, end = [], len(order)
    while end > 0:
        first = start[end]
        if first is None:
            end -= 1
            continue
        shared = min(common[first : end - 1])
        groups.append((order[first:end], shared))
        end = first
    return groups[::-1]


def _common_length(a: list[int], b: list[int]) -> int:
    """How many first tokens `a` and `b` share."""
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


def _shared_part(model: Any, prompts: list[list[int]], rows: list[int], shared: int) -> Part:
    """Rows sharing their first `shared` tokens: those once, then the rest of each prompt after
    them (left-padded: masked columns between the two)."""
    from transformers import DynamicCache

    device = model_device(model)
    prefix = torch.tensor([prompts[rows[0]][:shared]], device=device)
    cache, _ = run_prompts(model, prefix, torch.ones_like(prefix), DynamicCache())
    cache.batch_repeat_interleave(len(rows))
    rests = [prompts[row][shared:] for row in rows]
    width = max(len(rest) for rest in rests)
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    mask = torch.zeros(len(rows), shared + width, dtype=torch.long, device=device)
    mask[:, :shared] = 1
    for slot, rest in enumerate(rests):
        ids[slot, width - len(rest) :] = torch.tensor(rest, device=device)
        mask[slot, shared + width - len(rest) :] = 1
    cache, predicted = run_prompts(model, ids, mask, cache)
    return Part(rows, _layers(cache), mask, predicted)


def _part(model: Any, ids: torch.Tensor, mask: torch.Tensor, rows: list[int]) -> Part:
    """Rows of the batch run together, as wide as the longest of them."""
    from transformers import DynamicCache

    index = torch.tensor(rows, device=ids.device)
    part_ids, part_mask = ids[index], mask[index]
    narrow = int(part_mask.sum(-1).max())
    part_ids, part_mask = part_ids[:, -narrow:], part_mask[:, -narrow:]
    cache, predicted = run_prompts(model, part_ids, part_mask, DynamicCache())
    return Part(rows, _layers(cache), part_mask, predicted)


def _layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's keys and values."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def _assemble(parts: list[Part], width: int) -> tuple[Any, list[list[int]], torch.Tensor]:
    """The parts as one batch in row order, each left-padded to `width` columns: the cache,
    next tokens and mask."""
    from transformers import DynamicCache

    rows = [row for part in parts for row in part.rows]
    order = torch.empty(len(rows), dtype=torch.long)
    order[torch.tensor(rows)] = torch.arange(len(rows))  # batch row -> position in the parts
    order = order.to(parts[0].mask.device)

    def stacked(tensors: list[torch.Tensor], dim: int) -> torch.Tensor:
        """Padded on the left of `dim` to `width`, in batch row order."""
        pads = [(0, 0) * (t.dim() - 1 - dim) + (width - t.shape[dim], 0) for t in tensors]
        padded = [torch.nn.functional.pad(t, pad) for t, pad in zip(tensors, pads, strict=True)]
        return torch.cat(padded).index_select(0, order)

    layers = [
        tuple(stacked([part.layers[layer][kind] for part in parts], 2) for kind in (0, 1))
        for layer in range(len(parts[0].layers))
    ]
    predicted = [tokens for part in parts for tokens in part.predicted]
    mask = stacked([part.mask for part in parts], 1)
    return DynamicCache(layers), [predicted[i] for i in order.tolist()], mask


def run_prompts(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, cache: Any
) -> tuple[Any, list[list[int]]]:
    """One forward of left-padded prompts into `cache`: the cache and each row's next token
    (`model.generate`'s inputs: an all-ones mask dropped, position ids counting real tokens).

    `mask` covers the columns `cache` already holds, then `ids`'s.
    """
    extra = {"logits_to_keep": 1} if supports_logits_to_keep(model) else {}
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)[:, -ids.shape[1] :]
    out = model(
        input_ids=ids,
        attention_mask=None if bool(mask.all()) else mask,
        position_ids=positions,
        use_cache=True,
        **{cache_argument(model): cache},
        **extra,
    )
    return cache, [[token] for token in out.logits[:, -1].float().argmax(-1).tolist()]


def full_attention(cache: Any) -> bool:
    """Whether every layer of the cache keeps every key: masked columns (a shared prefix's
    gap, a rejected guess) are then only masked out. A sliding window counts columns, masked
    ones too, so models with one (Gemma 2 and 3, Mistral's window) never share prefixes, run
    parts or draft; nor do recurrent or linear-attention ones."""
    from transformers.cache_utils import DynamicLayer

    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)
