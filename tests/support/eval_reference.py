"""Plain reference computations for the eval tests: one sequence at a time, no batching, no
padding, no KV cache, nothing shared with eval/ but the tokenizer."""

from __future__ import annotations

import torch


def ids_of(tokenizer, text: str) -> list[int]:
    """Token ids of `text`, no special tokens."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(next token) at every position of one unpadded sequence: `[len(ids), vocab]`."""
    logits = model(input_ids=torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def logprob_after(model, context_ids: list[int], continuation_ids: list[int]) -> float:
    """Summed log-probability of the continuation after the context: one forward of both."""
    whole = context_ids + continuation_ids
    table = logprobs(model, whole)
    return sum(table[t - 1, whole[t]].item() for t in range(len(context_ids), len(whole)))


def choice_logprob(model, tokenizer, context: str, choice: str) -> float:
    """Summed log-probability of `choice` after BOS + `context`."""
    bos = [tokenizer.bos_token_id]
    context_ids = bos + ids_of(tokenizer, context)
    whole = bos + ids_of(tokenizer, context + choice)
    assert whole[: len(context_ids)] == context_ids  # true for the tiny byte-level tokenizer
    return logprob_after(model, context_ids, whole[len(context_ids) :])


def document_nll(model, tokenizer, text: str, window: int | None = None) -> tuple[float, int]:
    """NLL of every token of the text after BOS, and their count.

    With `window` (lm-eval's rolling windows, written out): token j of block k (tokens
    ``[k*window, (k+1)*window)``) is predicted from BOS and the tokens before it in block 0, and
    in a later block from the tokens since ``end - window - 1``, where `end` is the block's end
    (one forward per token: slow, but obviously right).
    """
    tokens = ids_of(tokenizer, text)
    if window is None:
        ids = [tokenizer.bos_token_id, *tokens]
        table = logprobs(model, ids)
        return -sum(table[j - 1, ids[j]].item() for j in range(1, len(ids))), len(tokens)
    total = 0.0
    for j, token in enumerate(tokens):
        block = j // window
        if block == 0:
            context = [tokenizer.bos_token_id, *tokens[:j]]
        else:
            end = min((block + 1) * window, len(tokens))
            context = tokens[end - window - 1 : j]
        total -= logprobs(model, context)[-1, token].item()
    return total, len(tokens)


@torch.no_grad()
def greedy_line(model, tokenizer, prompt: str, max_new_tokens: int) -> str:
    """Greedy decoding by full forward passes, stopped by a newline or EOS; the first line."""
    ids = [tokenizer.bos_token_id, *ids_of(tokenizer, prompt)]
    new: list[int] = []
    for _ in range(max_new_tokens):
        token = int(model(input_ids=torch.tensor([ids + new])).logits[0, -1].argmax())
        new.append(token)
        if token == tokenizer.eos_token_id or "\n" in tokenizer.decode([token]):
            break
    return tokenizer.decode(new, skip_special_tokens=True).split("\n")[0].strip()
