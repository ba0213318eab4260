"""``ppl``: rolling perplexity of held-out text, one row per language.

Each document is scored as lm-eval's ``loglikelihood_rolling`` scores it: tokenized with BOS as
lm-eval decides it (`eval.tokens`), cut into windows by lm-eval's rule (the first window starts
with the prefix token, BOS else EOS, and predicts the first ``max_length`` tokens; every later
window predicts the next ``max_length`` tokens, or the rest, after as much preceding text as
fits, so the last partial window sees a full window of context), every token predicted once
(`eval.scoring.document_loglikelihoods`, imported only when a model is scored).

Metrics: ``ppl`` (exp of the NLL per scored token), ``word_perplexity`` (per whitespace-separated
word, lm-eval's count), ``byte_perplexity`` (per UTF-8 byte), ``bits_per_byte`` (NLL / (ln 2 x
bytes), comparable across tokenizers), each with a ``_stderr`` from the spread of the
documents' NLLs (`ratio_stderr`), which localize uses as the metric's noise.

In a suite a ppl path names the language (``madlad/data/{lang2}/``); its metrics carry the
language in their names.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Any

from eval.data import JSONL_SUFFIXES, TEXT_SUFFIXES, has_suffix, text_sha256
from eval.data import read_documents as read_file_documents
from eval.errors import EvalDataError, MissingDataError, TaskSpecError, data_error
from eval.kinds.base import ADD_BOS, Expansion, Kind, Option, Settings, TaskSpec, count, register
from eval.kinds.base import name as _name
from eval.published import HubSource
from eval.tokens import TextEncoder, parse_add_bos
from surgery.hub.datasets import stream_documents

# MADLAD-400 shard names: <lang>_clean_0000.jsonl.gz -> language <lang>.
_SHARD_SUFFIX = re.compile(r"_clean_\d+$")


def language_files(path: Path, lang: str | None = None) -> dict[str, list[Path]]:
    """Find the text files of each language under `path`.

    - a file: one language, `lang` or the file name without extension and MADLAD shard suffix;
    - a folder with sub-folders (or a MADLAD root with `data/<lang>/`): one language per
      sub-folder, named after it;
    - a folder of files: one language, `lang` or the folder's name.

    Returns:
        language -> its .txt/.jsonl/.jsonl.gz files, sorted; languages sorted.

    Raises:
        EvalDataError: nothing there, or a language folder without data files.
        TaskSpecError: `lang` given for a folder of several languages.
    """
    if path.is_file():
        return {lang or _file_language(path): [path]}
    if not path.is_dir():
        raise data_error(path, None, "no such file or folder")
    root = path / "data" if (path / "data").is_dir() else path
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    if not folders:
        return {lang or root.name: _data_files(root)}
    if lang is not None:
        raise TaskSpecError(f"lang={lang} names one language, but {root} holds several folders")
    return {folder.name: _data_files(folder) for folder in folders}


def _file_language(path: Path) -> str:
    stem = path.name
    for suffix in (*JSONL_SUFFIXES, *TEXT_SUFFIXES):
        stem = stem.removesuffix(suffix)
    return _SHARD_SUFFIX.sub("", stem)


def _data_files(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.iterdir() if has_suffix(p, JSONL_SUFFIXES + TEXT_SUFFIXES))
    if not files:
        raise data_error(folder, None, "no .txt, .jsonl or .jsonl.gz files")
    return files


def read_documents(files: list[Path]) -> list[str]:
    """Documents of a language: each JSON line's `text`, or each blank-line-separated paragraph.

    Rows whose text is empty are skipped (nothing to score), as the training data reader does
    (both read through `surgery.core.textfiles`).

    Raises:
        EvalDataError: a malformed file, a row without a string `text`, or no text at all.
    """
    documents = [doc for path in files for doc in read_file_documents(path)]
    if not documents:
        raise data_error(files[0].parent, None, "no text to score")
    return documents


def count_words(text: str) -> int:
    """Words as lm-eval counts them for word_perplexity: ``len(re.split(r"\\s+", text))``."""
    return len(re.split(r"\s+", text))


def ratio_stderr(numerators: list[float], denominators: list[float]) -> float:
    """Standard error of sum(numerators) / sum(denominators) over documents (the delta method for
    a ratio of means: the spread of each document's NLL about the rate times its size; nan for
    fewer than 2 documents).

    Perplexities and bits per byte are such rates (NLL per token, word or byte), so their noise
    comes from how much documents differ, not from the value itself.
    """
    n = len(numerators)
    if n < 2:
        return math.nan
    rate = sum(numerators) / sum(denominators)
    spread = sum((x - rate * u) ** 2 for x, u in zip(numerators, denominators, strict=True))
    return math.sqrt(spread / (n - 1) / n) / (sum(denominators) / n)


def rate_metrics(nll: list[float], tokens: list[int], words: list[int], n_bytes: list[int]):
    """ppl, word_perplexity, byte_perplexity and bits_per_byte of documents' NLLs (natural log),
    each with its `_stderr` (of a perplexity exp(r): exp(r) times the rate's, the delta method)."""
    metrics: dict[str, float] = {}
    for name, sizes in (("ppl", tokens), ("word_perplexity", words), ("byte_perplexity", n_bytes)):
        rate = sum(nll) / sum(sizes)
        metrics[name] = math.exp(rate)
        metrics[f"{name}_stderr"] = math.exp(rate) * ratio_stderr(nll, sizes)
    metrics["bits_per_byte"] = sum(nll) / (math.log(2) * sum(n_bytes))
    metrics["bits_per_byte_stderr"] = ratio_stderr(nll, n_bytes) / math.log(2)
    return metrics


def _window(documents: list[str], window: slice, spec: TaskSpec) -> list[str]:
    """The documents kept by skip/take; none kept is an error naming the task."""
    kept = documents[window]
    if not kept:
        raise EvalDataError(
            f"task {spec.text!r}: no document after skipping {spec.options['skip']} "
            f"(of {len(documents)})"
        )
    return kept


class PerplexityTask:
    """Held-out text of one or more languages, read and checked."""

    def __init__(
        self, spec: TaskSpec, languages: dict[str, list[str]], source: HubSource | None = None
    ) -> None:
        self.spec = spec
        self.languages = languages
        self.source = source
        # A streamed Hub file is not kept whole: the unit's data is the documents read.
        self.files: list[Path] | None = [] if source is not None else None

    @classmethod
    def from_spec(cls, spec: TaskSpec) -> PerplexityTask:
        """Find and read every language's documents.

        Raises:
            EvalDataError: missing or malformed files.
        """
        options = spec.options
        window = slice(
            options["skip"], None if options["take"] is None else options["skip"] + options["take"]
        )
        if spec.dataset is not None:
            return cls._from_hub(spec, window)
        assert spec.path is not None  # parse_task guarantees a path or a dataset
        files = language_files(spec.path, options["lang"])
        languages = {
            lang: _window(read_documents(paths), window, spec) for lang, paths in files.items()
        }
        return cls(spec, languages)

    @classmethod
    def _from_hub(cls, spec: TaskSpec, window: slice) -> PerplexityTask:
        """Documents of one file of a Hub dataset (MADLAD-400's shard of a language)."""
        assert spec.dataset is not None
        name = spec.options["files"]
        if name is None:
            raise TaskSpecError(f"task {spec.text!r}: give files=PATH of the dataset to read")
        take = None if window.stop is None else window.stop - window.start
        documents, commit = stream_documents(
            spec.dataset, name, window.start, take, EvalDataError, MissingDataError
        )
        lang = spec.options["lang"] or _file_language(Path(name))
        source = HubSource(spec.dataset.repo, None, None, commit, Path(name))
        return cls(spec, {lang: _window(documents, slice(0, None), spec)}, source)

    @property
    def rows_sha256(self) -> str:
        """sha256 over the documents read (a streamed unit's data: no whole file is kept)."""
        digest = hashlib.sha256()
        for lang, documents in self.languages.items():
            for document in documents:
                digest.update(f"{lang}\0{text_sha256(document)}\n".encode())
        return digest.hexdigest()

    def config(self) -> dict[str, Any]:
        """Kind, path, languages and BOS rule."""
        return {
            "kind": "ppl",
            "path": str(self.spec.dataset or self.spec.path),
            **(
                {"files": self.spec.options["files"], "commit": self.source.commit}
                if self.source
                else {}
            ),
            **(
                {"skip": self.spec.options["skip"], "take": self.spec.options["take"]}
                if self.spec.options["skip"] or self.spec.options["take"] is not None
                else {}
            ),
            "languages": list(self.languages),
            "add_bos": self.spec.options["add_bos"],
        }

    def half_items(self, limit: int | None, seed: int) -> list[int]:
        """Every document (among the first `limit` of each language) may go into a half: no
        demonstrations. Documents are indexed per language (a suite's unit has one)."""
        counts = [len(documents) for documents in self.languages.values()]
        return list(range(min(limit or min(counts), *counts)))

    def run(self, model: Any, tokenizer: Any, settings: Settings) -> tuple[dict, dict]:
        """Score the first `limit` documents of each language (those of `settings.items`).

        Returns:
            `({<lang>/ppl, word_perplexity, byte_perplexity, bits_per_byte, each one's _stderr,
            tokens, n}, info)`.
        """
        from eval.scoring import document_loglikelihoods  # torch, once a model scores

        encoder = TextEncoder(tokenizer, parse_add_bos(self.spec.options["add_bos"]))
        metrics: dict[str, float | int] = {}
        for lang, documents in self.languages.items():
            kept = settings.keep(min(settings.limit or len(documents), len(documents)))
            docs = [documents[index] for index in kept]
            scored = document_loglikelihoods(
                model,
                encoder,
                docs,
                settings.max_length,
                batch_size=settings.batch_size,
                progress=settings.progress,
                desc=f"ppl {lang}",
            )
            tokens = sum(count for _, count in scored)
            if tokens == 0:  # only possible without a BOS/EOS prefix and one-token documents
                raise data_error(self.spec.path, None, f"{lang}: no token to score")
            rates = rate_metrics(
                [-ll for ll, _ in scored],
                [count for _, count in scored],
                [count_words(doc) for doc in docs],
                [len(doc.encode("utf-8")) for doc in docs],
            )
            metrics |= {f"{lang}/{name}": value for name, value in rates.items()}
            metrics[f"{lang}/tokens"] = tokens
            metrics[f"{lang}/n"] = len(docs)
            if settings.log is not None:
                for index, doc, (ll, count) in zip(kept, docs, scored, strict=True):
                    settings.log(
                        {
                            "task": self.spec.name,
                            "lang": lang,
                            "index": index,
                            "doc_id": str(index),
                            "prompt_sha256": text_sha256(doc),
                            "loglikelihood": ll,
                            "tokens": count,
                            "words": count_words(doc),
                            "bytes": len(doc.encode("utf-8")),
                        }
                    )
        windows_rule = f"lm-eval rolling windows of at most {settings.max_length} input tokens"
        return metrics, {"windows": windows_rule, "bos": encoder.describe()}


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
            "lang": Option(_name, None, "language name of a single file or folder"),
            "files": Option(
                str, None, "with hub:ID, the dataset's file to read (JSON lines, .gz or not)"
            ),
            "skip": Option(count(0), 0, "documents left out at the start of each language"),
            "take": Option(count(1), None, "documents read after those skipped (none: all)"),
            "add_bos": ADD_BOS,
        },
        loader=PerplexityTask.from_spec,
        hub=True,
        measure="perplexity",
        primary="ppl",
        role="learning",
    )
)
