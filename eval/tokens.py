"""How texts become token ids, with BOS as lm-evaluation-harness decides it.

lm-eval's HFLM encodes every context with the tokenizer's own special tokens
(``tokenizer.encode(text)``): Llama and Gemma tokenizers put BOS first, GPT-2, SmolLM and Qwen
tokenizers put nothing. Its "prefix token" (BOS, else EOS) is used only where a sequence needs
something to condition on: before the first rolling perplexity window, and as the context of an
empty prompt. `TextEncoder` reproduces both, and `add_bos=true/false` (every task's option)
overrides the tokenizer: always one BOS first, or never any special token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ADD_BOS_CHOICES = ("auto", "true", "false")


def parse_add_bos(text: str) -> bool | None:
    """The task option ``add_bos``: auto (the tokenizer decides, lm-eval's default), true, false."""
    return {"auto": None, "true": True, "false": False}[text]


@dataclass(frozen=True)
class TextEncoder:
    """A tokenizer and a BOS rule: None (as the tokenizer does), True (always), False (never)."""

    tokenizer: Any
    add_bos: bool | None = None

    @property
    def prefix_id(self) -> int | None:
        """lm-eval's prefix token: BOS, else EOS, else None."""
        for token_id in (self.tokenizer.bos_token_id, self.tokenizer.eos_token_id):
            if token_id is not None:
                return int(token_id)
        return None

    def plain(self, text: str) -> list[int]:
        """Token ids of `text` without any special token."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def __call__(self, text: str) -> list[int]:
        """Token ids of `text` as lm-eval's ``tok_encode`` gives them (with this BOS rule)."""
        if self.add_bos is False:
            return self.plain(text)
        if self.add_bos is True:
            prefix = [] if self.prefix_id is None else [self.prefix_id]
            return prefix + self.plain(text)
        # lm-eval skips special tokens when the text already starts with the prefix token.
        if self.prefix_id is not None:
            prefix_text = self.tokenizer.decode([self.prefix_id])
            if prefix_text and text.startswith(prefix_text):
                return self.plain(text)
        return list(self.tokenizer(text)["input_ids"])

    def describe(self) -> str:
        """The rule in words, for the output's config."""
        rule = {None: "auto (as the tokenizer encodes)", True: "true", False: "false"}
        sample = self("a")
        starts = (
            self.tokenizer.convert_ids_to_tokens(sample[0])
            if sample and sample[0] in self.tokenizer.all_special_ids
            else None
        )
        shown = f"texts start with {starts}" if starts else "no special token before texts"
        return f"add_bos={rule[self.add_bos]}: {shown}"
