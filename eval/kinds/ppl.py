"""``ppl``: rolling perplexity of held-out text, one row per language (`eval.perplexity`)."""

from __future__ import annotations

from typing import Any

from eval.kinds.base import ADD_BOS, Expansion, Kind, Option, count, name, register


class PerplexityKind(Kind):
    """A suite's ppl path names the language; its metrics carry the language in their names."""

    def suite_entry(self, entry: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """A path, or a Hub dataset with ``files`` (a template, e.g. MADLAD's shard of
        ``{lang2}``)."""
        path = self.dataset_entry(entry, "path")
        files = entry.pop("files", None)
        if files is not None and not isinstance(files, str):
            raise ValueError("files must be a path in the dataset (a template)")
        return path, ({"files": files} if files is not None else {})

    def suite_fields(self, extras: dict[str, Any]) -> dict[str, Any]:
        """The dataset's file template, when given."""
        return dict(extras)

    def extra_templates(self, extras: dict[str, Any]) -> list[str]:
        """The file template expands per language like the path."""
        return [extras["files"]] if "files" in extras else []

    def check_suite(self, per_language: bool) -> str | None:
        """A ppl task of a suite reads one language per unit."""
        if per_language:
            return None
        return "a ppl path must name the language, e.g. madlad/data/{lang2}/"

    def expand(
        self, options: dict[str, Any], lang_vars: dict[str, str], extras: dict[str, Any]
    ) -> list[Expansion]:
        """The unit's language is the task's ``lang``; a dataset's file template is expanded."""
        expanded = {**options, "lang": lang_vars.get("lang")}
        if "files" in extras:
            expanded["files"] = extras["files"].format_map(lang_vars)
        return [(None, None, expanded)]

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
        "(data/<lang>/...): one row per language; or hub:ID[@@REVISION] with files=PATH "
        "(allenai/MADLAD-400's data/<lang2>/<lang2>_clean_0000.jsonl.gz): skip/take stream "
        "the first documents of the file, fetching bytes in proportion",
        {
            "lang": Option(name, None, "language name of a single file or folder"),
            "files": Option(
                str, None, "with hub:ID, the dataset's file to read (JSON lines, .gz or not)"
            ),
            "skip": Option(count(0), 0, "documents left out at the start of each language"),
            "take": Option(count(1), None, "documents read after those skipped (none: all)"),
            "add_bos": ADD_BOS,
        },
        loader="eval.perplexity:PerplexityTask.from_spec",
        hub=True,
        measure="perplexity",
        primary="ppl",
        role="learning",
    )
)
