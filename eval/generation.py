"""Greedy generation, batched: to the end of the line (flores, copain) or a stop string
(exact_match).

One decoding loop from a KV cache serves every task. A batch holds as many prompts as a memory
budget allows (`generation_batches`), and a row leaves it, cache included, the step it stops:
no step computes a finished row. Prompts run in parts of similar length, side by side on a
CPU (`_prefill`), and once few rows are left a step also checks guessed tokens
(`eval.drafts`). The tokens are
`model.generate`'s greedy ones (left padding, the same attention mask and position ids), and so
lm-eval's HF ``generate_until``'s.

Each generation says why it stopped (`STOPS`): its line ended, the model's EOS, or the token
limit. Where the line ends, and how the scored line is cut, is the `postprocess` rule: our
`first_line` (stop at the first newline) or the reference's (`reference_line`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig

from eval.batching import left_pad
from eval.drafts import accepted, draft_length, lookup
from eval.model_loading import cache_argument, model_device, pad_id, supports_logits_to_keep
from eval.options import batch_size_given
from eval.tokens import TextEncoder
from eval.workers import map_batches

# Why a generation ended: a line break (the scored line is complete; what follows is cut), the
# model's end-of-sequence token, or the `max_new_tokens` limit.
STOPS = ("newline", "eos", "limit")
# How the scored line is cut from a generation (a flores task's `postprocess` option).
POSTPROCESS = ("first_line", "reference")


def has_line_break(text: str) -> bool:
    """Whether the reference's post-processing cuts `text`: a newline or a literal backslash-n
    after its leading whitespace."""
    stripped = text.lstrip()
    return "\n" in stripped or "\\n" in stripped


def newline_token_ids(tokenizer: Any) -> frozenset[int]:
    """Every id whose decoded text contains a newline (one batched decode of the vocabulary).

    A newline is one byte, so in byte-level and byte-fallback vocabularies it never straddles
    two tokens: checking single tokens is enough.
    """
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return frozenset(i for i, text in enumerate(texts) if "\n" in text)


def first_line(text: str) -> str:
    """The text before the first newline, without surrounding spaces."""
    return text.split("\n", 1)[0].strip()


def reference_line(text: str) -> str:
    """The reference's post-processing (its scripts/flores_postprocess.py): strip the leading
    whitespace, cut at the first newline or literal backslash-n, strip the rest."""
    text = text.lstrip()
    cuts = [index for index in (text.find("\\n"), text.find("\n")) if index >= 0]
    return (text[: min(cuts)] if cuts else text).strip()


@dataclass(frozen=True)
class Generation:
    """One prompt's greedy continuation.

    Attributes:
        text: the decoded continuation up to where generation stopped (special tokens skipped).
        line: the scored line cut from it (`first_line` or `reference_line`).
        stop: why generation stopped, one of `STOPS`.
    """

    text: str
    line: str
    stop: str


def generate_lines(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    max_length: int,
    batch_size: int | None = None,
    progress: bool = False,
    desc: str = "generating",
    add_bos: bool | None = None,
) -> list[str]:
    """Greedy continuation of each prompt up to its first newline (or EOS, or the token limit).

    Args:
        model: a causal LM in eval mode.
        tokenizer: its tokenizer.
        prompts: the prompts; BOS is added here as `add_bos` says (`eval.tokens`).
        max_new_tokens: most tokens generated per prompt.
        max_length: most tokens of prompt plus generation; prompts are cut from the left.
        batch_size: prompts per batch; None (or the default `--batch-size`, not given): as
            many as a memory budget holds (`generation_batches`).
        progress: show a progress bar.
        desc: its label.
        add_bos: None (as the tokenizer encodes, lm-eval's rule), True or False.

    Returns:
        One stripped line per prompt, in order.
    """
    generations = generate(
        model,
        tokenizer,
        prompts,
        max_new_tokens=max_new_tokens,
        max_length=max_length,
        batch_size=batch_size,
        progress=progress,
        desc=desc,
        add_bos=add_bos,
    )
    return [generation.line for generation in generations]


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    max_length: int,
    postprocess: str = "first_line",
    batch_size: int | None = None,
    progress: bool = False,
    desc: str = "generating",
    add_bos: bool | None = None,
) -> list[Generation]:
    """Greedy continuation of each prompt until its line ends (or EOS, or the token limit),
    with why it stopped and the line scored.

    Args:
        postprocess: `first_line` stops at the first token holding a newline and keeps the text
            before it; `reference` (the reference's rule, `reference_line`) skips leading
            whitespace, newlines included, and also cuts at a literal backslash-n: it gives the
            line the reference gets from a generation run to EOS or the token limit.
        Others: as `generate_lines`.

    Returns:
        One `Generation` per prompt, in order.
    """
    runs = greedy(
        model,
        tokenizer,
        prompts,
        _line_ended(tokenizer, postprocess),
        max_new_tokens,
        max_length,
        add_bos,
        batch_size=batch_size,
        progress=progress,
        desc=desc,
    )
    cut = first_line if postprocess == "first_line" else reference_line
    generations = []
    for tokens, stop in runs:
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        generations.append(Generation(text, cut(text), stop))
    return generations


def generate_until(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    stop: str,
    max_new_tokens: int,
    max_length: int,
    batch_size: int | None = None,
    progress: bool = False,
    desc: str = "generating",
    add_bos: bool | None = None,
) -> list[str]:
    """Greedy continuation of each prompt up to the first `stop` string (or EOS, or the token
    limit): the text before it, unstripped (lm-eval's ``until``).

    A row stops at the first token after which its generated text holds `stop`, wherever the
    token boundaries fall (lm-eval's stop rule); the text is then cut at the first `stop`.
    Other arguments as `generate_lines`.
    """
    runs = greedy(
        model,
        tokenizer,
        prompts,
        _holds(tokenizer, stop),
        max_new_tokens,
        max_length,
        add_bos,
        batch_size=batch_size,
        progress=progress,
        desc=desc,
    )
    return [
        tokenizer.decode(tokens, skip_special_tokens=True).split(stop, 1)[0] for tokens, _ in runs
    ]


def _line_ended(tokenizer: Any, postprocess: str) -> Ended:
    """A row's line has ended. `first_line`: its last token's text holds a newline.
    `reference`: its text, leading whitespace stripped, holds a newline or a literal
    backslash-n (the reference's post-processing cuts there, so nothing after it can change
    the scored line)."""
    if postprocess == "first_line":
        newlines = newline_token_ids(tokenizer)
        return lambda rows: [row[-1] in newlines for row in rows]
    return lambda rows: [
        has_line_break(text) for text in tokenizer.batch_decode(rows, skip_special_tokens=True)
    ]


def _holds(tokenizer: Any, stop: str) -> Ended:
    """A row's text holds `stop` (decoded as lm-eval's stop check decodes: special tokens
    kept)."""
    return lambda rows: [stop in text for text in tokenizer.batch_decode(rows)]


# Bytes of KV cache and activations one batch of generation may hold, on a CPU (an accelerator
# takes half its free memory when that is more): the rows of a batch are as many as fit.
GENERATION_BUDGET = 1 << 30

# Which of the active rows have ended, given each one's generated tokens (never EOS).
Ended = Callable[[list[list[int]]], list[bool]]


@torch.inference_mode()
def greedy(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    ended: Ended,
    max_new_tokens: int,
    max_length: int,
    add_bos: bool | None,
    *,
    batch_size: int | None,
    progress: bool,
    desc: str,
) -> list[tuple[list[int], str]]:
    """Each prompt's greedy continuation and why it stopped, longest prompts batched first.

    Args:
        ended: which rows have ended (`Ended`): stop "newline" (the line or the stop string).
        Others: as `generate_lines`.

    Returns:
        Per prompt, in order: `(generated tokens, EOS left out, stop)`, the stop one of
        `STOPS`.
    """
    encoder = TextEncoder(tokenizer, add_bos)
    room = max(1, max_length - max_new_tokens)
    encoded = [encoder(p)[-room:] for p in prompts]
    eos = _eos_ids(_greedy_config(model, tokenizer, max_new_tokens))
    results: list[Any] = [None] * len(encoded)
    device = model_device(model)
    batches = generation_batches(model, [len(e) for e in encoded], max_new_tokens, batch_size)
    for indices in tqdm(batches, desc=desc, disable=not progress, leave=False):
        ids, mask = left_pad([encoded[i] for i in indices], device, pad_id(tokenizer))
        decoded = _decode(model, ids, mask, max_new_tokens, eos, ended)
        for index, result in zip(indices, decoded, strict=True):
            results[index] = result
    return results


def generation_batches(
    model: Any, lengths: Sequence[int], max_new_tokens: int, batch_size: int | None = None
) -> list[list[int]]:
    """The prompts' indices in batches, longest prompts first (a batch holds similar lengths).

    Args:
        model: the model (its config and dtype size the rows).
        lengths: each prompt's length in tokens.
        max_new_tokens: most tokens generated per prompt.
        batch_size: prompts per batch; None (or the default `--batch-size`, not given): as
            many as `GENERATION_BUDGET` holds (`row_bytes` for the batch's longest prompt).

    Returns:
        Lists of indices into `lengths`.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if batch_size is not None and batch_size_given(batch_size):
        return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    budget = _budget(model_device(model))
    batches, start = [], 0
    while start < len(order):
        rows = max(1, budget // row_bytes(model, lengths[order[start]], max_new_tokens))
        batches.append(order[start : start + rows])
        start += rows
    return batches


def row_bytes(model: Any, width: int, max_new_tokens: int) -> int:
    """Bytes one row of a batch needs at most: its KV cache at `width` prompt tokens plus
    `max_new_tokens`, one layer's activations and attention scores (float32) over the prompt,
    and a row of float32 logits."""
    config = model.config.get_text_config(decoder=True)
    element = next(model.parameters()).element_size()
    hidden, heads = config.hidden_size, config.num_attention_heads
    inner = getattr(config, "intermediate_size", None) or 4 * hidden
    activations = (4 * hidden + 3 * inner) * element + heads * width * 4
    cache = cache_bytes_per_token(model) * (width + max_new_tokens)
    return cache + activations * width + 4 * config.vocab_size


def cache_bytes_per_token(model: Any) -> int:
    """Bytes of keys and values one token adds to one row's KV cache (every layer)."""
    config = model.config.get_text_config(decoder=True)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    element = next(model.parameters()).element_size()
    return 2 * config.num_hidden_layers * kv_heads * head_dim * element


def _budget(device: torch.device) -> int:
    """`GENERATION_BUDGET`, or half the accelerator's free memory when that is more."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return max(GENERATION_BUDGET, free // 2)
    return GENERATION_BUDGET


def _decode(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    max_new_tokens: int,
    eos: set[int],
    ended: Ended,
) -> list[tuple[list[int], str]]:
    """Greedy decoding of one left-padded batch from a KV cache; a row leaves the batch (and
    the cache) at EOS, when `ended` says its line ended, or at the token limit.

    The inputs are `model.generate`'s: position ids count the real tokens, an all-ones mask
    is dropped, and each step feeds the last token with the mask one column longer. Once few
    rows are left, a step also feeds each row's guessed next tokens (`eval.drafts`) and keeps
    those the model predicts itself; the columns of the rejected ones are masked out.
    """
    results: list[Any] = [([], "limit") for _ in range(ids.shape[0])]
    generated: list[list[int]] = [[] for _ in range(ids.shape[0])]
    prompts = [row[keep.bool()].tolist() for row, keep in zip(ids, mask, strict=True)]
    active = list(range(ids.shape[0]))  # the rows still generating, in batch order
    cache, predicted = _prefill(model, ids, mask)
    fixed: dict[str, Any] = {cache_argument(model): cache, "use_cache": True}
    keep_logits = supports_logits_to_keep(model)
    drafting = _full_attention(cache)
    attention, padded = mask, not bool(mask.all())
    fed = mask.sum(-1) - 1  # per row, the position of the first token the last forward fed
    guesses: list[list[int]] = [[] for _ in active]
    while True:
        made = [accepted(guess, row) for guess, row in zip(guesses, predicted, strict=True)]
        if any(guesses):  # guessed columns the model did not confirm never count again
            for slot, tokens in enumerate(made):
                attention[slot, attention.shape[1] - len(predicted[slot]) + len(tokens) :] = 0
            padded = True
        keep = _take(made, [generated[row] for row in active], eos, ended, max_new_tokens)
        for slot, stop in enumerate(keep):
            if stop is not None:
                results[active[slot]] = (generated[active[slot]], stop)
        kept = [slot for slot, stop in enumerate(keep) if stop is None]
        if not kept:
            return results
        fed = fed + torch.tensor([len(tokens) for tokens in made], device=fed.device)
        if len(kept) < len(active):  # finished rows leave: later steps never compute them
            index = torch.tensor(kept, device=ids.device)
            cache.batch_select_indices(index)
            fed, attention = fed[index], attention[index]
        active = [active[slot] for slot in kept]
        # Rejected guesses stay as masked columns: at most `max_new_tokens` of them, so the
        # cache never holds more than the prompt width plus twice `max_new_tokens` columns.
        left = max(max_new_tokens - len(generated[row]) for row in active)
        room = ids.shape[1] + 2 * max_new_tokens - attention.shape[1] - left if drafting else 0
        guesses = _guesses(active, prompts, generated, max_new_tokens, room)
        width = max(len(guess) for guess in guesses)
        rows = [[made[slot][-1], *guess, *[0] * (width - len(guess))]
                for slot, guess in zip(kept, guesses, strict=True)]  # fmt: skip
        attention = torch.cat([attention, attention.new_ones(len(kept), width + 1)], dim=-1)
        if keep_logits:
            fixed["logits_to_keep"] = width + 1
        out = model(
            input_ids=torch.tensor(rows, device=ids.device),
            attention_mask=attention if padded else None,
            position_ids=fed[:, None] + torch.arange(width + 1, device=ids.device),
            **fixed,
        )
        predicted = out.logits[:, -(width + 1) :].float().argmax(-1).tolist()
        del out


# Tokens (rows x width) each part of a batch's prompts runs at once: rows of similar length
# together, so little of the prompt pass computes padding (batches are sorted longest first).
PREFILL_TOKENS = 512


def _prefill(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> tuple[Any, list[list[int]]]:
    """Run a left-padded batch's prompts: its KV cache, and each row's greedy next token.

    A model whose cache keeps every key (`_full_attention`) runs the rows in parts of about
    `PREFILL_TOKENS` tokens, each part only as wide as its longest prompt, side by side on a
    CPU (`eval.workers.map_batches`); each part's keys and values are padded on the left to the
    batch's width (masked columns, as padding is).
    """
    from transformers import DynamicCache

    config = model.config.get_text_config(decoder=True)
    width = ids.shape[1]
    step = max(1, PREFILL_TOKENS // width)
    if not _full_attention(DynamicCache(config=config)) or step >= ids.shape[0]:
        return _run_prompts(model, ids, mask, DynamicCache(config=config))

    def run(start: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[list[int]]]:
        part = mask[start : start + step]
        narrow = int(part.sum(-1).max())
        cache, tokens = _run_prompts(
            model, ids[start : start + step, -narrow:], part[:, -narrow:], DynamicCache()
        )
        return [(layer.keys, layer.values) for layer in cache.layers], tokens

    # The parts are independent: on a CPU they run side by side, one per thread.
    parts, predicted = [], []
    for layers, tokens in map_batches(run, range(0, ids.shape[0], step), model_device(model)):
        parts.append(layers)
        predicted += tokens
    layers = [
        tuple(torch.cat([_left_pad(part[layer][kind], width) for part in parts]) for kind in (0, 1))
        for layer in range(len(parts[0]))
    ]
    return DynamicCache(layers), predicted


def _left_pad(states: torch.Tensor, width: int) -> torch.Tensor:
    """Keys or values (`[rows, heads, length, dim]`) padded with zeros on the left to `width`."""
    return torch.nn.functional.pad(states, (0, 0, width - states.shape[2], 0))


def _run_prompts(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, cache: Any
) -> tuple[Any, list[list[int]]]:
    """One forward of left-padded prompts into `cache`: the cache and each row's next token
    (`model.generate`'s inputs: an all-ones mask dropped, position ids counting real tokens)."""
    extra = {"logits_to_keep": 1} if supports_logits_to_keep(model) else {}
    out = model(
        input_ids=ids,
        attention_mask=None if bool(mask.all()) else mask,
        position_ids=(mask.cumsum(-1) - 1).masked_fill(mask == 0, 0),
        use_cache=True,
        **{cache_argument(model): cache},
        **extra,
    )
    return cache, [[token] for token in out.logits[:, -1].float().argmax(-1).tolist()]


def _take(
    made: list[list[int]],
    rows: list[list[int]],
    eos: set[int],
    ended: Ended,
    max_new_tokens: int,
) -> list[str | None]:
    """Append each row's new tokens to it, one position at a time, up to where it stops.

    Returns:
        Per row, why it stopped (one of `STOPS`), or None if it goes on.
    """
    stops: list[str | None] = [None] * len(rows)
    for position in range(max(len(tokens) for tokens in made)):
        going = [s for s, tokens in enumerate(made) if stops[s] is None and position < len(tokens)]
        live = []
        for slot in going:
            if made[slot][position] in eos:
                stops[slot] = "eos"
            else:
                rows[slot].append(made[slot][position])
                live.append(slot)
        for slot, stop in zip(live, ended([rows[slot] for slot in live]), strict=True):
            if stop or len(rows[slot]) == max_new_tokens:
                stops[slot] = "newline" if stop else "limit"
    return stops


def _guesses(
    active: list[int],
    prompts: list[list[int]],
    generated: list[list[int]],
    max_new_tokens: int,
    room: int,
) -> list[list[int]]:
    """Each active row's guessed next tokens (`eval.drafts`): at most `room`, none past the
    token limit."""
    length = min(draft_length(len(active)), room)
    if length == 0:
        return [[] for _ in active]
    return [
        lookup(prompts[row] + generated[row], min(length, max_new_tokens - len(generated[row]) - 1))
        for row in active
    ]


def _full_attention(cache: Any) -> bool:
    """Whether every layer of the cache keeps every key: a rejected guess's column is then
    only masked out. A sliding window counts columns, rejected ones too, so models with one
    (Gemma 2 and 3, Mistral's window) never draft; nor do recurrent or linear-attention ones."""
    from transformers.cache_utils import DynamicLayer

    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


def _eos_ids(config: GenerationConfig) -> set[int]:
    """The ids that end a generation (one or several)."""
    eos = config.eos_token_id
    if eos is None:
        return set()
    return {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}


def _greedy_config(model: Any, tokenizer: Any, max_new_tokens: int) -> GenerationConfig:
    # A fresh config: the checkpoint's own may ask for sampling (temperature, top_p).
    eos = getattr(model.generation_config, "eos_token_id", None)
    return GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos if eos is not None else tokenizer.eos_token_id,
        pad_token_id=pad_id(tokenizer),
    )
