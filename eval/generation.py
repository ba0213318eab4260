"""Greedy generation that stops at the end of the line, batched (translation and Copain)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from eval.batching import left_pad
from eval.model_loading import model_device, pad_id
from eval.tokens import TextEncoder


class StopAtNewline(StoppingCriteria):
    """Marks a row done once it has produced a token whose text contains a newline."""

    def __init__(self, newline_ids: torch.Tensor) -> None:
        self.newline_ids = newline_ids

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        """Per row: did the last token contain a newline?"""
        return torch.isin(input_ids[:, -1], self.newline_ids.to(input_ids.device))


def newline_token_ids(tokenizer: Any) -> torch.Tensor:
    """Every id whose decoded text contains a newline (one batched decode of the vocabulary).

    A newline is one byte, so in byte-level and byte-fallback vocabularies it never straddles
    two tokens: checking single tokens is enough.
    """
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return torch.tensor([i for i, text in enumerate(texts) if "\n" in text], dtype=torch.long)


def first_line(text: str) -> str:
    """The text before the first newline, without surrounding spaces."""
    return text.split("\n", 1)[0].strip()


def generate_lines(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    max_length: int,
    batch_size: int = 8,
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
        batch_size: prompts per `generate` call.
        progress: show a progress bar.
        desc: its label.
        add_bos: None (as the tokenizer encodes, lm-eval's rule), True or False.

    Returns:
        One stripped line per prompt, in order.
    """
    stop = StoppingCriteriaList([StopAtNewline(newline_token_ids(tokenizer))])
    texts = _generate(
        model,
        tokenizer,
        prompts,
        {"stopping_criteria": stop},
        max_new_tokens=max_new_tokens,
        max_length=max_length,
        batch_size=batch_size,
        progress=progress,
        desc=desc,
        add_bos=add_bos,
    )
    return [first_line(text) for text in texts]


def generate_until(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    stop: str,
    max_new_tokens: int,
    max_length: int,
    batch_size: int = 8,
    progress: bool = False,
    desc: str = "generating",
    add_bos: bool | None = None,
) -> list[str]:
    """Greedy continuation of each prompt up to the first `stop` string (or EOS, or the token
    limit): the text before it, unstripped (lm-eval's ``until``).

    transformers stops a row once its text holds `stop`, wherever the token boundaries fall
    (``stop_strings``); the text is then cut at the first `stop`. Other arguments as
    `generate_lines`.
    """
    texts = _generate(
        model,
        tokenizer,
        prompts,
        {"stop_strings": [stop], "tokenizer": tokenizer},
        max_new_tokens=max_new_tokens,
        max_length=max_length,
        batch_size=batch_size,
        progress=progress,
        desc=desc,
        add_bos=add_bos,
    )
    return [text.split(stop, 1)[0] for text in texts]


@torch.no_grad()
def _generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    stopping: dict[str, Any],
    *,
    max_new_tokens: int,
    max_length: int,
    batch_size: int,
    progress: bool,
    desc: str,
    add_bos: bool | None,
) -> list[str]:
    """The decoded new tokens of each prompt's greedy continuation (`stopping`: the extra
    arguments of ``model.generate`` that end a row), longest prompts batched first."""
    encoder = TextEncoder(tokenizer, add_bos)
    room = max(1, max_length - max_new_tokens)
    encoded = [encoder(p)[-room:] for p in prompts]
    config = _greedy_config(model, tokenizer, max_new_tokens)
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    texts = [""] * len(encoded)
    device = model_device(model)
    starts = range(0, len(order), batch_size)
    for start in tqdm(starts, desc=desc, disable=not progress, leave=False):
        indices = order[start : start + batch_size]
        ids, mask = left_pad([encoded[i] for i in indices], device, pad_id(tokenizer))
        out = model.generate(
            input_ids=ids, attention_mask=mask, generation_config=config, **stopping
        )
        for index, row in zip(indices, out[:, ids.shape[1] :], strict=True):
            texts[index] = tokenizer.decode(row, skip_special_tokens=True)
    return texts


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
