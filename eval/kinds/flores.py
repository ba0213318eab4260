"""``flores``: FLORES+/FLORES-200 translation scored by chrF (`eval.translation`).

In a suite a flores task names a folder (``dir``) and ``directions`` (``SRC-TGT`` templates);
each language expands to one unit per direction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eval.errors import EvalDataError, TaskSpecError, data_error
from eval.kinds.base import (
    ADD_BOS,
    REQUIRED,
    Expansion,
    Kind,
    Option,
    choice,
    count,
    name,
    register,
    shots,
)
from eval.languages import is_code
from surgery.hub.datasets import nearby

DEFAULT_DIRECTIONS = ("eng_Latn-{lang}", "{lang}-eng_Latn")


def find_language_file(root: Path, split: str, lang: str) -> Path:
    """Locate one language's sentences under a FLORES folder.

    Looks in `root/<split>/` then `root/` for `<lang>.<split>` (FLORES-200), `<split>.<lang>`
    (FLORES+ on GitHub), `<lang>.parquet` (FLORES+ on the Hub: ``devtest/<lang>.parquet``),
    `<lang>.jsonl`, `<lang>.jsonl.gz` and `<lang>.txt`.

    Raises:
        EvalDataError: none of them exists (the message names the languages nearby).
    """
    names = _names(split, lang)
    for folder in (root / split, root):
        for file_name in names:
            if (folder / file_name).is_file():
                return folder / file_name
    looked = ", ".join(names)
    present = {
        path.name.split(".")[0]
        for folder in (root / split, root)
        if folder.is_dir()
        for path in folder.iterdir()
        if path.is_file() and is_code(path.name.split(".")[0])
    }
    raise data_error(
        root,
        None,
        f"no {lang} file for split {split} (looked for {looked}); languages nearby: "
        + nearby(lang, present),
    )


def _names(split: str, lang: str) -> list[str]:
    return [
        f"{lang}.{split}",
        f"{split}.{lang}",
        f"{lang}.parquet",
        f"{lang}.jsonl",
        f"{lang}.jsonl.gz",
        f"{lang}.txt",
    ]


def language_file_name(files: list[str], split: str, lang: str) -> str | None:
    """`find_language_file` on a repository's file list: the name that holds a language."""
    present = set(files)
    for folder in (f"{split}/", ""):
        for file_name in _names(split, lang):
            if folder + file_name in present:
                return folder + file_name
    return None


class FloresKind(Kind):
    """A suite's flores task: a folder (``dir``) and directions instead of src/tgt."""

    def suite_entry(self, entry: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """``dir`` is the path; ``directions`` (default both ways with English) are kept."""
        path = self.dataset_entry(entry, "dir")
        directions = tuple(entry.pop("directions", DEFAULT_DIRECTIONS))
        for forbidden in ("src", "tgt"):
            if forbidden in entry:
                raise ValueError(f"give directions: [SRC-TGT, ...], not {forbidden}")
        return path, {"directions": directions}

    def suite_fields(self, extras: dict[str, Any]) -> dict[str, Any]:
        """The directions as written."""
        return {"directions": list(extras.get("directions", ()))}

    def extra_templates(self, extras: dict[str, Any]) -> list[str]:
        """The directions are templates over the language's variables."""
        return list(extras.get("directions", ()))

    def expand(
        self, options: dict[str, Any], lang_vars: dict[str, str], extras: dict[str, Any]
    ) -> list[Expansion]:
        """One unit per direction; ``eng_Latn-{lang}`` for English itself is left out."""
        result: list[Expansion] = []
        for template in extras.get("directions", ()):
            direction = template.format_map(lang_vars)
            src, sep, tgt = direction.partition("-")
            if not sep or not is_code(src) or not is_code(tgt):
                raise TaskSpecError(f"flores direction {template!r}: expected SRC-TGT codes")
            if src == tgt:  # nothing to translate
                continue
            result.append((template, direction, {**options, "src": src, "tgt": tgt}))
        return result

    def missing(self, spec: Any) -> str | None:
        """The split folder of the first language without a file (a Hub dataset: checked when
        it is fetched)."""
        if spec.path is None:
            return None
        splits = {spec.options["split"], spec.options["shots_split"] or spec.options["split"]}
        for split in sorted(splits):
            for lang in (spec.options["src"], spec.options["tgt"]):
                try:
                    find_language_file(spec.path, split, lang)
                except EvalDataError:
                    return str(spec.path / split / lang)
        return None


KIND = register(
    FloresKind(
        "flores",
        "DIR",
        "FLORES+/FLORES-200 translation scored by chrF; DIR holds <split>/<lang>.parquet "
        "(FLORES+ as published), <lang>.<split> (FLORES-200) or <lang>.jsonl[.gz]; or "
        "hub:openlanguagedata/flores_plus[@SPLIT[@REVISION]] (gated: accept its terms, log in); "
        "only the two languages' files are fetched",
        {
            "src": Option(name, REQUIRED, "source language code, e.g. eng_Latn"),
            "tgt": Option(name, REQUIRED, "target language code"),
            "shots": shots(2),
            "split": Option(name, "devtest", "split to translate and draw demonstrations from"),
            "shots_split": Option(
                name, None, "split to draw demonstrations from instead (FLORES+'s dev)"
            ),
            "metric": Option(choice("chrf", "chrf++"), "chrf", "chrf or chrf++"),
            "max_new_tokens": Option(count(1), 256, "longest translation generated"),
            "postprocess": Option(
                choice("first_line", "reference"),
                "first_line",
                "first_line: the text before the first newline; reference: the paper's "
                "(leading whitespace skipped, also cut at a literal backslash-n)",
            ),
            "src_name": Option(str, None, "source language name in the prompt"),
            "tgt_name": Option(str, None, "target language name in the prompt"),
            "add_bos": ADD_BOS,
        },
        loader="eval.translation:TranslationTask.from_spec",
        hub=True,
        measure="chrf",
        primary="chrf",
    )
)
