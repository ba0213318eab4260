"""Log-likelihood of continuations after a shared context: one context forward per item.

For a multiple-choice item with context C and choices K1..Kn, the naive way runs n forwards of
C+Ki. Here C runs once (a batch of items, left-padded), its KV cache is repeated once per
choice, and only the choice tokens run a second forward against that cache. The last context
position already predicts each choice's first token, so one-token choices (Belebele's " A".." D")
need no second forward at all. tests/test_eval_scores.py checks the result against per-choice
forward passes on Llama and Gemma-3 (sliding-window layers included).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from eval.batching import left_pad, right_pad
from eval.model_loading import encode, model_device


@dataclass(frozen=True)
class ChoiceRequest:
    """Token ids of one item: the context (prefix included) and each choice's continuation."""

    context: list[int]
    continuations: list[list[int]]


def make_request(
    tokenizer: Any, prefix: list[int], context: str, choices: Sequence[str], max_length: int
) -> tuple[ChoiceRequest, bool]:
    """Tokenize an item the way lm-evaluation-harness does, and fit it into `max_length`.

    Each continuation is the tail of `encode(context + choice)` after `encode(context)`, so a
    tokenizer that adds a word-start marker to lone strings (SentencePiece) still gives the
    tokens the model would see in running text. If the context's tokens are not a prefix of the
    whole (a merge across the boundary), the choice is encoded on its own.

    Args:
        tokenizer: a Hugging Face tokenizer.
        prefix: ids put before the context (BOS), see `model_loading.prefix_ids`.
        context: the prompt.
        choices: the answer strings, each scored after the context.
        max_length: longest sequence the model may see; the context is cut from the left.

    Returns:
        `(request, truncated)`.
    """
    context_ids = encode(tokenizer, context)
    continuations = []
    for choice in choices:
        whole = encode(tokenizer, context + choice)
        if whole[: len(context_ids)] == context_ids and len(whole) > len(context_ids):
            continuations.append(whole[len(context_ids) :])
        else:
            continuations.append(encode(tokenizer, choice))
    full = prefix + context_ids
    room = max(1, max_length - max(len(c) for c in continuations))
    return ChoiceRequest(full[-room:], continuations), len(full) > room


@functools.cache
def _forward_parameters(model_class: type) -> frozenset[str]:
    return frozenset(inspect.signature(model_class.forward).parameters)


def cache_argument(model: Any) -> str:
    """Name of the forward argument that takes a KV cache (`cache` in recent 5.x releases)."""
    return "cache" if "cache" in _forward_parameters(type(model)) else "past_key_values"


def _supports_logits_to_keep(model: Any) -> bool:
    return "logits_to_keep" in _forward_parameters(type(model))


@torch.no_grad()
def choice_loglikelihoods(
    model: Any,
    requests: Sequence[ChoiceRequest],
    *,
    batch_size: int = 8,
    progress: bool = False,
    desc: str = "scoring",
) -> list[list[float]]:
    """Summed log-probability of each continuation given its context.

    Args:
        model: a causal LM in eval mode.
        requests: the items.
        batch_size: items per context forward (the choice forward holds items x choices rows).
        progress: show a progress bar.
        desc: its label.

    Returns:
        For each request, one float per continuation, in the order given.
    """
    # Longest contexts first: batches hold similar lengths (less padding), and an out-of-memory
    # error shows up in the first batch rather than at the end of a long run.
    order = sorted(range(len(requests)), key=lambda i: -len(requests[i].context))
    results: list[list[float]] = [[] for _ in requests]
    starts = range(0, len(order), batch_size)
    for start in tqdm(starts, desc=desc, disable=not progress, leave=False):
        indices = order[start : start + batch_size]
        scores = _score_batch(model, [requests[i] for i in indices])
        for index, item_scores in zip(indices, scores, strict=True):
            results[index] = item_scores
    return results


def _score_batch(model: Any, batch: list[ChoiceRequest]) -> list[list[float]]:
    device = model_device(model)
    # One row per (item, choice).
    owners = [i for i, r in enumerate(batch) for _ in r.continuations]
    conts = [c for r in batch for c in r.continuations]
    needs_tails = max(len(c) for c in conts) > 1  # else no second forward, no cache to keep

    # Context forward, left-padded so every item's last token sits in the last column.
    ids, mask = left_pad([r.context for r in batch], device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    extra = {"logits_to_keep": 1} if _supports_logits_to_keep(model) else {}
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=needs_tails, **extra
    )
    last = torch.log_softmax(out.logits[:, -1].float(), dim=-1)  # [items, vocab]

    owner_index = torch.tensor(owners, device=device)
    first = torch.tensor([c[0] for c in conts], device=device)
    totals = last[owner_index, first].double()  # the context's last logits score token 1
    if needs_tails:
        totals += _score_tails(model, out, mask, owner_index, conts)
    flat = totals.tolist()
    scores, at = [], 0
    for request in batch:
        scores.append(flat[at : at + len(request.continuations)])
        at += len(request.continuations)
    return scores


def _score_tails(
    model: Any,
    context_out: Any,
    context_mask: torch.Tensor,
    owner_index: torch.Tensor,
    conts: list[list[int]],
) -> torch.Tensor:
    """Log-probability of tokens 2.. of each continuation, from a forward over the cache."""
    device = context_mask.device
    cache = getattr(context_out, "cache", None)
    if cache is None:
        cache = context_out.past_key_values
    # Repeat each item's cached context once per choice (rows gathered, so choice counts may
    # differ between items).
    cache.batch_select_indices(owner_index)
    # Input: every continuation token but the last (which is only a target), right-padded:
    # padding after the real tokens is never attended by them under a causal mask.
    inputs, tail_mask = right_pad([c[:-1] for c in conts], device)
    targets, _ = right_pad([c[1:] for c in conts], device)
    rows_mask = context_mask[owner_index]
    positions = rows_mask.sum(-1, keepdim=True) + torch.arange(inputs.shape[1], device=device)
    out = model(
        input_ids=inputs,
        attention_mask=torch.cat([rows_mask, tail_mask], dim=1),
        position_ids=positions,
        use_cache=True,
        **{cache_argument(model): cache},
    )
    logprobs = torch.log_softmax(out.logits.float(), dim=-1)
    picked = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [rows, tail length]
    return (picked.double() * tail_mask).sum(-1)
