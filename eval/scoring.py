"""Log-likelihood of continuations after a shared context: one context forward per item.

For a multiple-choice item with context C and choices K1..Kn, the naive way runs n forwards of
C+Ki. Here C runs once (a batch of items, left-padded), its KV cache is repeated once per
choice, and only the choice tokens run a second forward against that cache. The last context
position already predicts each choice's first token, so one-token choices (Belebele's " A".." D")
need no second forward at all. Contexts that start with the same tokens (few-shot
demonstrations) run that prefix once per call and every batch of them starts from its KV cache
(eval.prefix_cache). tests/test_eval_scores.py checks the result against per-choice
forward passes on Llama and Gemma-3 (sliding-window layers included).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from eval.batching import left_pad, right_pad
from eval.errors import EvalDataError
from eval.model_loading import cache_argument, model_device, supports_logits_to_keep
from eval.prefix_cache import SharedPrefix, encode_shared_prefix
from eval.tokens import TextEncoder


@dataclass(frozen=True)
class ChoiceRequest:
    """Token ids of one item: the context (prefix included) and each choice's continuation."""

    context: list[int]
    continuations: list[list[int]]


def make_request(
    encoder: TextEncoder, context: str, continuations: Sequence[str], max_length: int
) -> tuple[ChoiceRequest, bool]:
    """Tokenize an item exactly as lm-evaluation-harness does, and fit it into `max_length`.

    As lm-eval's ``_encode_pair``: trailing spaces of the context move to the front of each
    continuation; the context is encoded alone (with BOS as `encoder` decides) and each
    continuation is the tail of ``encode(context + continuation)`` after the context's length,
    so a tokenizer that merges across the boundary gives the tokens the model sees in running
    text. An empty context is lm-eval's prefix token (BOS, else EOS).

    Args:
        encoder: the tokenizer with its BOS rule.
        context: the prompt.
        continuations: the strings scored after it (choices with their leading delimiter).
        max_length: longest input the model may see; as lm-eval, at most ``max_length + 1``
            tokens of context plus continuation are kept (cut from the left).

    Returns:
        `(request, truncated)`.

    Raises:
        EvalDataError: a continuation that adds no token to the context.
    """
    stripped = context.rstrip()
    spaces = context[len(stripped) :]
    if stripped:
        context_ids = encoder(stripped)
        conts = [encoder(stripped + spaces + c)[len(context_ids) :] for c in continuations]
    else:
        prefix = encoder.prefix_id
        context_ids = [] if prefix is None else [prefix]
        conts = [encoder(spaces + c) for c in continuations]
    for text, ids in zip(continuations, conts, strict=True):
        if not ids:
            raise EvalDataError(f"choice {text!r} adds no token after its context")
    # lm-eval keeps (context + continuation)[-(max_length + 1):] per choice; one shared context
    # here, so it is cut for the longest continuation.
    room = max(1, max_length + 1 - max(len(c) for c in conts))
    return ChoiceRequest(context_ids[-room:], conts), len(context_ids) > room


@torch.no_grad()
def choice_loglikelihoods(
    model: Any,
    requests: Sequence[ChoiceRequest],
    *,
    batch_size: int = 8,
    progress: bool = False,
    desc: str = "scoring",
    prefix_cache: bool = True,
) -> list[list[float]]:
    """Summed log-probability of each continuation given its context.

    Args:
        model: a causal LM in eval mode.
        requests: the items.
        batch_size: items per context forward (the choice forward holds items x choices rows).
        progress: show a progress bar.
        desc: its label.
        prefix_cache: run the token prefix most contexts share (few-shot demonstrations) once
            and start their batches from its KV cache (`eval.prefix_cache`; the same scores);
            False runs every context whole.

    Returns:
        For each request, one float per continuation, in the order given.
    """
    prefix = encode_shared_prefix(model, [r.context for r in requests]) if prefix_cache else None
    members = set(prefix.members) if prefix is not None else set()
    # Contexts starting with the shared prefix are batched together (they run from its cache),
    # the others apart, as whole contexts.
    groups = [
        (sorted(members), prefix),
        ([i for i in range(len(requests)) if i not in members], None),
    ]
    batches = [
        (indices, group_prefix)
        for group, group_prefix in groups
        for indices in _batches(group, requests, batch_size)
    ]
    results: list[list[float]] = [[] for _ in requests]
    for indices, group_prefix in tqdm(batches, desc=desc, disable=not progress, leave=False):
        scores = _score_batch(model, [requests[i] for i in indices], group_prefix)
        for index, item_scores in zip(indices, scores, strict=True):
            results[index] = item_scores
    return results


def _batches(
    indices: list[int], requests: Sequence[ChoiceRequest], batch_size: int
) -> list[list[int]]:
    """`indices` in batches, longest contexts first: batches hold similar lengths (less
    padding), and an out-of-memory error shows up in the first batch rather than at the end."""
    order = sorted(indices, key=lambda i: -len(requests[i].context))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def _score_batch(
    model: Any, batch: list[ChoiceRequest], prefix: SharedPrefix | None
) -> list[list[float]]:
    device = model_device(model)
    # One row per (item, choice).
    owners = [i for i, r in enumerate(batch) for _ in r.continuations]
    conts = [c for r in batch for c in r.continuations]
    needs_tails = max(len(c) for c in conts) > 1  # else no second forward, no cache to keep

    # Context forward, left-padded so every item's last token sits in the last column.
    ids, mask = left_pad([r.context for r in batch], device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    extra = {"logits_to_keep": 1} if supports_logits_to_keep(model) else {}
    if prefix is not None:
        # The first prefix.length columns come from the shared prefix's cache; the rest runs.
        extra[cache_argument(model)] = prefix.for_batch(mask)
        ids, positions = ids[:, prefix.length :], positions[:, prefix.length :]
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        use_cache=needs_tails or prefix is not None,
        **extra,
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
