"""Log-likelihoods from the model, lm-evaluation-harness's two requests: of continuations
after a context (multiple choice), and of a document in rolling windows (perplexity).

Continuations after a shared context take one context forward per item. For a multiple-choice
item with context C and choices K1..Kn, the naive way runs n forwards of
C+Ki. Here C runs once (a batch of items, left-padded), its KV cache is repeated once per
choice, and only the choice tokens run a second forward against that cache. The last context
position already predicts each choice's first token, so one-token choices (Belebele's " A".." D")
need no second forward at all. Contexts that start with the same tokens (few-shot
demonstrations) run that prefix once per call and every batch of them starts from its KV cache
(eval.prefix_cache); among them, questions on one passage run the passage once per batch
(`eval.prefix_cache.shared_groups`, `_grouped_last_logits`). On a CPU with several threads,
batches run side by side, each on its share of the threads (eval.workers).
tests/test_eval_scores.py checks the result against per-choice forward passes on Llama and
Gemma-3 (sliding-window layers included).

A document is scored as lm-eval's ``loglikelihood_rolling`` scores it: cut into windows by
lm-eval's rule (`rolling_windows`), every token predicted once. The logits of a batch of windows
are never all held at once: windows are run in slices of positions (`LOGITS_BUDGET` bytes of
float32 logits per slice), the later slices attending to the earlier ones through the KV cache.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from eval.attention import grouped_query_attention
from eval.batching import left_pad, right_pad
from eval.errors import EvalDataError
from eval.model_loading import cache_argument, model_device, supports_logits_to_keep
from eval.prefix_cache import (
    SharedPrefix,
    encode_shared_prefix,
    plain_attention_cache,
    shared_groups,
    shared_prefix,
    sliding_window_layers,
)
from eval.tokens import TextEncoder
from eval.workers import map_batches

# Most bytes of float32 logits one forward slice of rolling windows may hold.
LOGITS_BUDGET = 256 * 2**20


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
    contexts = [r.context for r in requests]
    length, members = shared_prefix(contexts) if prefix_cache else (0, [])
    if members and not plain_attention_cache(model):
        length, members = 0, []
    batches = [
        (rows, shared)
        for units, shared in _units(requests, length, members, batch_size)
        for rows in _batches(units, requests, batch_size)
    ]
    results: list[list[float]] = [[] for _ in requests]
    bar = tqdm(total=len(batches), desc=desc, disable=not progress, leave=False)
    with grouped_query_attention(model_device(model)):
        scored = _score_batches(model, requests, batches, bool(members))
        for (units, _), scores in zip(batches, scored, strict=True):
            for index, item_scores in zip(_indices(units), scores, strict=True):
                results[index] = item_scores
            bar.update()
    bar.close()
    return results


def _score_batches(
    model: Any,
    requests: Sequence[ChoiceRequest],
    batches: list[tuple[list[Unit], bool]],
    shared: bool,
) -> Iterator[list[list[float]]]:
    """Each batch's scores, in order; batches flagged True start from the shared prefix.

    The prefix is encoded as the first job: the batches that do not share it (first in
    `batches`) run beside it, and those that start from it wait for it. With nothing to run
    beside it, it is encoded before them, on every thread.
    """
    contexts = [r.context for r in requests]
    encoded: Future[SharedPrefix | None] = Future()
    beside = shared and not all(flag for _, flag in batches)
    if shared and not beside:
        encoded.set_result(encode_shared_prefix(model, contexts))

    def run(job: tuple[list[Unit], bool] | None) -> list[list[float]] | None:
        if job is None:
            try:
                encoded.set_result(encode_shared_prefix(model, contexts))
            except BaseException as error:  # batches waiting for it raise it too
                encoded.set_exception(error)
                raise
            return None
        units, flag = job
        return _score_batch(model, requests, units, encoded.result() if flag else None)

    jobs: list[tuple[list[Unit], bool] | None] = [None, *batches] if beside else [*batches]
    for job, scores in zip(jobs, map_batches(run, jobs, model_device(model)), strict=True):
        if job is not None:
            yield scores


# Items that run together from one head: `(indices, length)`, their contexts' first `length`
# tokens shared (`eval.prefix_cache.shared_groups`).
Unit = tuple[list[int], int]


def _units(
    requests: Sequence[ChoiceRequest], length: int, members: list[int], batch_size: int
) -> list[tuple[list[Unit], bool]]:
    """The items in units, first those that do not start with the shared prefix (`length`
    tokens; they run whole), then its `members` (they run from its cache); with the flag
    saying which."""
    others = sorted(set(range(len(requests))) - set(members))
    alone = [([i], len(requests[i].context) - 1) for i in others]
    if not members:
        return [(alone, False)]
    one_token = all(len(c) == 1 for i in members for c in requests[i].continuations)
    if one_token:  # choices after a group's rows would need a third forward: not grouped
        units = shared_groups([r.context for r in requests], length, members, batch_size)
    else:
        units = [([i], len(requests[i].context) - 1) for i in members]
    return [(alone, False), (units, True)]


def _indices(units: list[Unit]) -> list[int]:
    return [i for indices, _ in units for i in indices]


def _batches(
    units: list[Unit], requests: Sequence[ChoiceRequest], batch_size: int
) -> list[list[Unit]]:
    """Units in batches of at most `batch_size` items, longest contexts first: batches hold
    similar lengths (less padding), and an out-of-memory error shows up in the first batch
    rather than at the end."""
    order = sorted(units, key=lambda u: -len(requests[u[0][0]].context))
    batches: list[list[Unit]] = []
    for unit in order:
        if not batches or len(_indices(batches[-1])) + len(unit[0]) > batch_size:
            batches.append([])
        batches[-1].append(unit)
    return batches


def _score_batch(
    model: Any,
    requests: Sequence[ChoiceRequest],
    units: list[Unit],
    prefix: SharedPrefix | None,
) -> list[list[float]]:
    """Scores of a batch's items, in the order of `units`."""
    batch = [requests[i] for i in _indices(units)]
    if prefix is not None and any(len(indices) > 1 for indices, _ in units):
        last = _grouped_last_logits(model, requests, units, prefix)
        return _split(_first_tokens(last, batch), batch)
    device = model_device(model)
    conts = [c for r in batch for c in r.continuations]
    needs_tails = max(len(c) for c in conts) > 1  # else no second forward, no cache to keep
    if prefix is not None and not needs_tails:
        # Every row reads the same prefix columns (views, no copy); its own tokens run after.
        rows = torch.ones(len(batch), prefix.length, dtype=torch.long, device=device)
        rests = [r.context[prefix.length :] for r in batch]
        last = _last_logits_after(model, prefix.expanded(len(batch)), rows, rests)
        return _split(_first_tokens(last, batch), batch)

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
    totals = _first_tokens(out.logits[:, -1], batch)
    if needs_tails:
        owners = [i for i, r in enumerate(batch) for _ in r.continuations]
        owner_index = torch.tensor(owners, device=device)
        totals += _score_tails(model, out, mask, owner_index, conts)
    return _split(totals, batch)


def _first_tokens(last: torch.Tensor, batch: list[ChoiceRequest]) -> torch.Tensor:
    """Log-probability of each continuation's first token (float64, one per continuation)
    from its item's last context logits (`last`: `[items, vocab]`)."""
    device = last.device
    logprobs = torch.log_softmax(last.float(), dim=-1)
    owners = torch.tensor([i for i, r in enumerate(batch) for _ in r.continuations], device=device)
    first = torch.tensor([c[0] for r in batch for c in r.continuations], device=device)
    return logprobs[owners, first].double()


def _split(totals: torch.Tensor, batch: list[ChoiceRequest]) -> list[list[float]]:
    """Per-continuation totals back into one list per item."""
    flat = totals.tolist()
    scores, at = [], 0
    for request in batch:
        scores.append(flat[at : at + len(request.continuations)])
        at += len(request.continuations)
    return scores


def _grouped_last_logits(
    model: Any, requests: Sequence[ChoiceRequest], units: list[Unit], prefix: SharedPrefix
) -> torch.Tensor:
    """Each item's last context logits (`[items, vocab]`, in the order of `units`), its unit's
    shared tokens run once.

    The heads (a unit's shared tokens) run from the prefix cache, left-padded, as contexts do.
    Their cache is repeated once per item, and each item's own tokens run after it
    (`_last_logits_after`).
    """
    device = model_device(model)
    heads = [requests[indices[0]].context[:length] for indices, length in units]
    ids, mask = left_pad(heads, device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    head_out = model(
        input_ids=ids[:, prefix.length :],
        attention_mask=mask,
        position_ids=positions[:, prefix.length :],
        use_cache=True,
        **{cache_argument(model): prefix.for_batch(mask)},
        **({"logits_to_keep": 1} if supports_logits_to_keep(model) else {}),
    )
    cache = _output_cache(head_out)
    owners = [u for u, (indices, _) in enumerate(units) for _ in indices]
    owner_index = torch.tensor(owners, device=device)
    cache.batch_select_indices(owner_index)
    rests = [requests[i].context[length:] for indices, length in units for i in indices]
    return _last_logits_after(model, cache, mask[owner_index], rests)


def _last_logits_after(
    model: Any, cache: Any, cache_mask: torch.Tensor, rests: list[list[int]]
) -> torch.Tensor:
    """Logits at the last token of each row of `rests` (`[rows, vocab]`), run after `cache`
    (one cache row per row; `cache_mask` says which of its columns are tokens).

    Where every layer attends to all earlier tokens, the rows are left-padded: all end in the
    last column, the only one projected to logits; the padding between the cache and a row's
    tokens is masked out. Sliding-window layers count distances in columns, so there the rows
    are right-padded: column distances stay token distances, padding after a row's tokens is
    never attended by them, and logits are projected at every column where some row ends.
    """
    device = cache_mask.device
    start = cache_mask.sum(-1, keepdim=True)
    if sliding_window_layers(model):
        inputs, rest_mask = right_pad(rests, device)
        positions = start + torch.arange(inputs.shape[1], device=device)
        ends = torch.tensor([len(rest) - 1 for rest in rests], device=device)
    else:
        inputs, rest_mask = left_pad(rests, device)
        positions = start + (rest_mask.cumsum(-1) - 1).clamp(min=0)
        ends = torch.full((len(rests),), inputs.shape[1] - 1, device=device)
    keep = torch.unique(ends)
    extra = {"logits_to_keep": keep} if supports_logits_to_keep(model) else {}
    out = model(
        input_ids=inputs,
        attention_mask=torch.cat([cache_mask, rest_mask], dim=1),
        position_ids=positions,
        use_cache=True,
        **{cache_argument(model): cache},
        **extra,
    )
    columns = torch.searchsorted(keep, ends) if extra else ends
    return out.logits[torch.arange(len(rests), device=device), columns]


def _output_cache(out: Any) -> Any:
    """The KV cache a forward returned (``cache`` in some models' outputs)."""
    cache = getattr(out, "cache", None)
    return out.past_key_values if cache is None else cache


def _score_tails(
    model: Any,
    context_out: Any,
    context_mask: torch.Tensor,
    owner_index: torch.Tensor,
    conts: list[list[int]],
) -> torch.Tensor:
    """Log-probability of tokens 2.. of each continuation, from a forward over the cache."""
    device = context_mask.device
    cache = _output_cache(context_out)
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


def rolling_windows(
    tokens: list[int], prefix: int | None, max_length: int
) -> list[tuple[list[int], list[int]]]:
    """lm-eval's ``get_rolling_token_windows(context_len=1)`` + ``make_disjoint_window``.

    Args:
        tokens: the document's token ids (every one is predicted).
        prefix: the token the first window starts with (None: the first token is only context).
        max_length: most input tokens per window.

    Returns:
        `(context, continuation)` pairs: the model reads ``(context + continuation)[:-1]`` and
        scores every continuation token.
    """
    if prefix is None:  # nothing to condition the first token on: it is context only
        if len(tokens) < 2:
            return []
        head, tokens = [tokens[0]], tokens[1:]
    else:
        head = [prefix]
    pairs = []
    first = min(max_length, len(tokens))
    pairs.append((head + tokens[: first - 1], tokens[:first]))
    predicted = first
    while predicted < len(tokens):
        size = min(len(tokens) - predicted, max_length)
        end = predicted + size
        pairs.append((tokens[max(0, end - max_length - 1) : end - 1], tokens[end - size : end]))
        predicted = end
    # make_disjoint_window: the context stops where the continuation starts.
    return [(context[: len(context) - (len(cont) - 1)], cont) for context, cont in pairs]


def windows(ids: list[int], max_length: int) -> list[tuple[list[int], list[int]]]:
    """Rolling windows of a sequence whose first id is the prefix (as `rolling_windows`)."""
    return rolling_windows(ids[1:], ids[0], max_length)


@torch.no_grad()
def window_loglikelihoods(
    model: Any,
    pairs: list[tuple[list[int], list[int]]],
    *,
    batch_size: int = 8,
    budget: int | None = None,
    progress: bool = False,
    desc: str = "perplexity",
) -> list[float]:
    """Summed log-probability of each window's continuation after its context.

    Args:
        model: a causal LM in eval mode.
        pairs: `(context, continuation)` windows, inputs at most the model's length.
        batch_size: windows per forward.
        budget: most bytes of float32 logits per forward slice (default `LOGITS_BUDGET`).
        progress: show a progress bar.
        desc: its label.

    Returns:
        One float per window, in order.
    """
    order = sorted(range(len(pairs)), key=lambda i: -len(pairs[i][0]) - len(pairs[i][1]))
    results = [0.0] * len(pairs)
    device = model_device(model)
    vocab = output_size(model)
    starts = range(0, len(order), batch_size)
    for start in tqdm(starts, desc=desc, disable=not progress, leave=False):
        indices = order[start : start + batch_size]
        rows = [pairs[i][0] + pairs[i][1] for i in indices]
        ids, mask = right_pad([row[:-1] for row in rows], device)
        targets, _ = right_pad([row[1:] for row in rows], device)
        # Scored positions: the last len(continuation) inputs of each row.
        scored = torch.zeros_like(mask)
        for r, i in enumerate(indices):
            width = len(rows[r]) - 1
            scored[r, width - len(pairs[i][1]) : width] = 1
        width = max(1, (budget or LOGITS_BUDGET) // (4 * vocab * len(indices)))
        totals = _sliced_logprobs(model, ids, mask, targets, scored, width)
        for r, i in enumerate(indices):
            results[i] = totals[r]
    return results


def _sliced_logprobs(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    targets: torch.Tensor,
    scored: torch.Tensor,
    width: int,
) -> list[float]:
    """Sum of log p(target) over scored positions, `width` positions per forward."""
    totals = torch.zeros(ids.shape[0], dtype=torch.float64, device=ids.device)
    cache = None
    for start in range(0, ids.shape[1], width):
        stop = min(start + width, ids.shape[1])
        kwargs: dict[str, Any] = {}
        if cache is not None:
            kwargs[cache_argument(model)] = cache
        positions = torch.arange(start, stop, device=ids.device).expand(ids.shape[0], -1)
        out = model(
            input_ids=ids[:, start:stop],
            attention_mask=mask[:, :stop],
            position_ids=positions,
            use_cache=stop < ids.shape[1],
            **kwargs,
        )
        if stop < ids.shape[1]:
            cache = _output_cache(out)
        logprobs = torch.log_softmax(out.logits.float(), dim=-1)  # [rows, width, vocab]
        del out
        picked = logprobs.gather(-1, targets[:, start:stop].unsqueeze(-1)).squeeze(-1)
        totals += (picked.double() * scored[:, start:stop]).sum(-1)
    return totals.tolist()


def output_size(model: Any) -> int:
    """Rows of the output embedding: the width of one position's logits."""
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    config = getattr(model.config, "text_config", None) or model.config
    return int(config.vocab_size)


def document_loglikelihoods(
    model: Any,
    encoder: TextEncoder,
    documents: list[str],
    max_length: int,
    *,
    batch_size: int = 8,
    budget: int | None = None,
    progress: bool = False,
    desc: str = "perplexity",
) -> list[tuple[float, int]]:
    """Each document's rolling log-likelihood (natural log) and number of scored tokens."""
    per_doc = [rolling_windows(encoder(doc), encoder.prefix_id, max_length) for doc in documents]
    flat = [pair for pairs in per_doc for pair in pairs]
    scores = window_loglikelihoods(
        model, flat, batch_size=batch_size, budget=budget, progress=progress, desc=desc
    )
    result, at = [], 0
    for pairs in per_doc:
        total = sum(scores[at : at + len(pairs)])
        result.append((total, sum(len(cont) for _, cont in pairs)))
        at += len(pairs)
    return result
