"""Greedy generation, batched: to the end of the line (flores, copain) or a stop string
(exact_match).

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
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from eval.batching import left_pad
from eval.model_loading import model_device, pad_id
from eval.tokens import TextEncoder

# Why a generation ended: a line break (the scored line is complete; what follows is cut), the
# model's end-of-sequence token, or the `max_new_tokens` limit.
STOPS = ("newline", "eos", "limit")
# How the scored line is cut from a generation (a flores task's `postprocess` option).
POSTPROCESS = ("first_line", "reference")


class StopAtLineEnd(StoppingCriteria):
    """Marks a row done once its line has ended, and remembers how many tokens it had then.

    `first_line`: the last token's text contains a newline. `reference`: the generated text,
    leading whitespace stripped, contains a newline or a literal backslash-n (the reference's
    post-processing cuts there, so nothing after it can change the scored line).
    """

    def __init__(
        self, tokenizer: Any, newline_ids: torch.Tensor, prompt_length: int, postprocess: str
    ) -> None:
        self.tokenizer = tokenizer
        self.newline_ids = newline_ids
        self.prompt_length = prompt_length
        self.postprocess = postprocess
        self.lengths: dict[int, int] = {}  # row -> generated tokens when its line ended

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        """Per row: has its line ended (now or before)?"""
        if self.postprocess == "first_line":
            ended = torch.isin(input_ids[:, -1], self.newline_ids.to(input_ids.device))
        else:
            texts = self.tokenizer.batch_decode(
                input_ids[:, self.prompt_length :], skip_special_tokens=True
            )
            ended = torch.tensor([has_line_break(t) for t in texts], device=input_ids.device)
        for row in torch.nonzero(ended).flatten().tolist():
            self.lengths.setdefault(row, input_ids.shape[1] - self.prompt_length)
        return ended


def has_line_break(text: str) -> bool:
    """Whether the reference's post-processing cuts `text`: a newline or a literal backslash-n
    after its leading whitespace."""
    stripped = text.lstrip()
    return "\n" in stripped or "\\n" in stripped


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
    batch_size: int = 8,
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
    eos = _eos_ids(_greedy_config(model, tokenizer, max_new_tokens))
    newlines = newline_token_ids(tokenizer)

    def batch(prompt_length: int) -> tuple[dict[str, Any], Callable[[int, list[int]], Any]]:
        stop = StopAtLineEnd(tokenizer, newlines, prompt_length, postprocess)

        def finish(row: int, tokens: list[int]) -> Generation:
            return _finish(tokenizer, tokens, stop.lengths.get(row), eos, postprocess)

        return {"stopping_criteria": StoppingCriteriaList([stop])}, finish

    return _greedy(
        model,
        tokenizer,
        prompts,
        batch,
        max_new_tokens,
        max_length,
        add_bos,
        batch_size=batch_size,
        progress=progress,
        desc=desc,
    )


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

    def batch(prompt_length: int) -> tuple[dict[str, Any], Callable[[int, list[int]], Any]]:
        def finish(row: int, tokens: list[int]) -> str:
            return tokenizer.decode(tokens, skip_special_tokens=True).split(stop, 1)[0]

        return {"stop_strings": [stop], "tokenizer": tokenizer}, finish

    return _greedy(
        model,
        tokenizer,
        prompts,
        batch,
        max_new_tokens,
        max_length,
        add_bos,
        batch_size=batch_size,
        progress=progress,
        desc=desc,
    )


@torch.no_grad()
def _greedy(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    batch: Callable[[int], tuple[dict[str, Any], Callable[[int, list[int]], Any]]],
    max_new_tokens: int,
    max_length: int,
    add_bos: bool | None,
    *,
    batch_size: int,
    progress: bool,
    desc: str,
) -> list[Any]:
    """Each prompt's greedy continuation, longest prompts batched first. `batch(prompt
    length)` gives the arguments of ``model.generate`` that end a row, and the function that
    turns a row's generated tokens (and its row number in the batch) into its result."""
    encoder = TextEncoder(tokenizer, add_bos)
    room = max(1, max_length - max_new_tokens)
    encoded = [encoder(p)[-room:] for p in prompts]
    config = _greedy_config(model, tokenizer, max_new_tokens)
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    results: list[Any] = [None] * len(encoded)
    device = model_device(model)
    starts = range(0, len(order), batch_size)
    for start in tqdm(starts, desc=desc, disable=not progress, leave=False):
        indices = order[start : start + batch_size]
        ids, mask = left_pad([encoded[i] for i in indices], device, pad_id(tokenizer))
        stopping, finish = batch(ids.shape[1])
        out = model.generate(
            input_ids=ids, attention_mask=mask, generation_config=config, **stopping
        )
        generated = out[:, ids.shape[1] :].tolist()
        for row, (index, tokens) in enumerate(zip(indices, generated, strict=True)):
            results[index] = finish(row, tokens)
    return results


def _finish(
    tokenizer: Any, tokens: list[int], ended: int | None, eos: set[int], postprocess: str
) -> Generation:
    """A row's generation: its tokens up to the end of its line (`ended` tokens), else up to
    EOS, else all of them (the token limit); what follows the first of these is padding."""
    at_eos = next((i for i, token in enumerate(tokens) if token in eos), None)
    if ended is not None and (at_eos is None or ended <= at_eos):
        stop, tokens = "newline", tokens[:ended]
    elif at_eos is not None:
        stop, tokens = "eos", tokens[:at_eos]
    else:
        stop = "limit"
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    line = first_line(text) if postprocess == "first_line" else reference_line(text)
    return Generation(text, line, stop)


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
