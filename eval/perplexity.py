"""Perplexity and bits per byte on held-out text, one row per language.

Each document is tokenized without special tokens, the prefix (BOS, see
`model_loading.prefix_ids`) is put in front, and every document token is predicted exactly
once: the sequence is cut into disjoint windows of at most `max_length` input tokens, each
window predicting the token after each of its inputs (so only the first window sees BOS, as in
lm-evaluation-harness's rolling log-likelihood). Token perplexity is exp(total NLL / tokens);
bits per byte is total NLL / (ln 2 x UTF-8 bytes), which does not depend on the tokenizer.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from eval.batching import right_pad
from eval.data import JSONL_SUFFIXES, TEXT_SUFFIXES, has_suffix
from eval.data import read_documents as read_file_documents
from eval.errors import TaskSpecError, data_error
from eval.model_loading import encode, model_device, prefix_ids
from eval.tasks import Settings, TaskSpec

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


def windows(ids: list[int], max_length: int) -> list[list[int]]:
    """Cut `ids` into chunks of at most `max_length + 1` tokens overlapping by one token.

    Chunk k holds inputs ``ids[k*L : k*L+L]`` and, shifted by one, their targets; together the
    chunks predict every token of ``ids[1:]`` exactly once.
    """
    step = max_length
    return [ids[start : start + step + 1] for start in range(0, len(ids) - 1, step)]


@torch.no_grad()
def total_nll(
    model: Any,
    tokenizer: Any,
    documents: list[str],
    max_length: int,
    *,
    batch_size: int = 8,
    progress: bool = False,
    desc: str = "perplexity",
) -> tuple[float, int]:
    """Summed negative log-likelihood (nats) of every document token, and how many tokens.

    Args:
        model: a causal LM in eval mode.
        tokenizer: its tokenizer.
        documents: the texts.
        max_length: most input tokens per forward.
        batch_size: windows per forward.
        progress: show a progress bar.
        desc: its label.

    Returns:
        `(total NLL, scored tokens)`.
    """
    prefix = prefix_ids(tokenizer)
    chunks = [c for doc in documents for c in windows(prefix + encode(tokenizer, doc), max_length)]
    chunks.sort(key=len, reverse=True)  # similar lengths share a batch: less padding
    device = model_device(model)
    total, count = 0.0, 0
    starts = range(0, len(chunks), batch_size)
    for start in tqdm(starts, desc=desc, disable=not progress, leave=False):
        batch = chunks[start : start + batch_size]
        ids, mask = right_pad(batch, device)
        logits = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1]).logits
        for row in range(len(batch)):  # one row at a time bounds the float32 copy of the logits
            nll = F.cross_entropy(logits[row].float(), ids[row, 1:], reduction="none")
            total += (nll.double() * mask[row, 1:]).sum().item()
        count += int(mask[:, 1:].sum())
    return total, count


class PerplexityTask:
    """Held-out text of one or more languages, read and checked."""

    def __init__(self, spec: TaskSpec, languages: dict[str, list[str]]) -> None:
        self.spec = spec
        self.languages = languages

    @classmethod
    def from_spec(cls, spec: TaskSpec) -> PerplexityTask:
        """Find and read every language's documents.

        Raises:
            EvalDataError: missing or malformed files.
        """
        assert spec.path is not None  # parse_task guarantees a path for ppl
        files = language_files(spec.path, spec.options["lang"])
        return cls(spec, {lang: read_documents(paths) for lang, paths in files.items()})

    def config(self) -> dict[str, Any]:
        """Kind, path and languages."""
        return {"kind": "ppl", "path": str(self.spec.path), "languages": list(self.languages)}

    def run(self, model: Any, tokenizer: Any, settings: Settings) -> tuple[dict, dict]:
        """Score the first `limit` documents of each language.

        Returns:
            `({<lang>/ppl, <lang>/bits_per_byte, <lang>/tokens, <lang>/n}, {windows})`.
        """
        metrics: dict[str, float | int] = {}
        for lang, documents in self.languages.items():
            docs = documents[: settings.limit] if settings.limit else documents
            nll, tokens = total_nll(
                model,
                tokenizer,
                docs,
                settings.max_length,
                batch_size=settings.batch_size,
                progress=settings.progress,
                desc=f"ppl {lang}",
            )
            if tokens == 0:  # only possible without a BOS/EOS prefix and one-token documents
                raise data_error(self.spec.path, None, f"{lang}: no token to score")
            n_bytes = sum(len(doc.encode("utf-8")) for doc in docs)
            metrics[f"{lang}/ppl"] = math.exp(nll / tokens)
            metrics[f"{lang}/bits_per_byte"] = nll / (math.log(2) * n_bytes)
            metrics[f"{lang}/tokens"] = tokens
            metrics[f"{lang}/n"] = len(docs)
        # How BOS is handled is stated once for the run, in config["bos"].
        return metrics, {"windows": f"disjoint, at most {settings.max_length} input tokens each"}
