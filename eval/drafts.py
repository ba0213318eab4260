"""Drafts for greedy decoding: tokens guessed from a row's own text, checked by the model.

When few rows are left in a batch, a decoding step costs about what reading the weights costs,
whatever the number of tokens it runs. A step can then run each row's last token followed by a
guess of the next ones (prompt lookup: what followed the last occurrence of the row's latest
tokens, in its prompt or in what it generated), and keep the guessed tokens the model itself
predicts, plus the model's token after them. Greedy decoding keeps only the model's argmax
tokens, so a wrong guess costs compute, never a different generation: the guess is checked
token by token against the logits at the position before it.

Rows that repeat themselves (a generation run to the token limit) and translations that copy
words from the prompt are where guesses hold.
"""

from __future__ import annotations

from collections.abc import Sequence

# Most tokens (rows x positions) one drafting step runs: small batches stay in the regime
# where a step's cost is the weights' reading. A batch of more rows than this never drafts.
DRAFT_TOKENS = 48
# Most guessed tokens per row and step, and the longest suffix looked up.
MOST_GUESSED = 8
LONGEST_MATCH = 3


def draft_length(rows: int) -> int:
    """Tokens to guess per row in a step of `rows` rows (0: a plain step)."""
    return max(0, min(MOST_GUESSED, DRAFT_TOKENS // max(rows, 1) - 1))


def lookup(sequence: Sequence[int], count: int) -> list[int]:
    """Up to `count` tokens that followed the latest earlier occurrence of the sequence's last
    tokens (the longest suffix of at most `LONGEST_MATCH` tokens that occurred before).

    What followed is copied as the guess grows, so a loop shorter than `count` (a word
    repeated) is guessed for `count` tokens.
    """
    size = len(sequence)
    if count <= 0:
        return []
    for length in range(min(LONGEST_MATCH, size - 1), 0, -1):
        tail = list(sequence[size - length :])
        for start in range(size - length - 1, -1, -1):
            if list(sequence[start : start + length]) == tail:
                source = start + length
                guess: list[int] = []
                for index in range(source, source + count):
                    guess.append(sequence[index] if index < size else guess[index - size])
                return guess
    return []


def accepted(guess: Sequence[int], predicted: Sequence[int]) -> list[int]:
    """The tokens greedy decoding makes of one drafting step: `predicted[i]` is the argmax after
    the step's i-th input (the row's last token, then the guess). The first is always the
    model's; each next one counts only while the guess before it was the model's own token."""
    tokens = [predicted[0]]
    for index, token in enumerate(guess):
        if token != predicted[index]:
            break
        tokens.append(predicted[index + 1])
    return tokens
