"""``ppl``: rolling perplexity of held-out text, one row per language (`eval.perplexity`)."""

from __future__ import annotations

from typing import Any

from eval.kinds.base import ADD_BOS, Expansion, Kind, Option, name, register


class PerplexityKind(Kind):
    """A suite's ppl path names the language; its metrics carry the language in their names."""

    def check_suite(self, per_language: bool) -> str | None:
        """A ppl task of a suite reads one language per unit."""
        if per_language:
            return None
        return "a ppl path must name the language, e.g. madlad/data/{lang2}/"

    def expand(
        self, options: dict[str, Any], lang_vars: dict[str, str], extras: dict[str, Any]
    ) -> list[Expansion]:
        """The unit's language is the task's ``lang``."""
        return [(None, None, {**options, "lang": lang_vars.get("lang")})]

    def metric_prefix(self, task: str, lang: str | None) -> str:
        """``task/lang/``: one row per language."""
        return f"{task}/" + (f"{lang}/" if lang else "")


KIND = register(
    PerplexityKind(
        "ppl",
        "PATH",
        "rolling perplexity as lm-eval computes it: ppl (per token), word_perplexity, "
        "byte_perplexity, bits_per_byte, each with its stderr over documents; PATH is a .txt "
        "(documents separated by blank lines), "
        '.jsonl or .jsonl.gz file ("text" field), a folder of them, or a MADLAD-400 root '
        "(data/<lang>/...): one row per language",
        {
            "lang": Option(name, None, "language name of a single file or folder"),
            "add_bos": ADD_BOS,
        },
        loader="eval.perplexity:PerplexityTask.from_spec",
        measure="perplexity",
        primary="ppl",
        role="learning",
    )
)
