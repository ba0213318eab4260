"""Perplexity, bits per byte and lm-evaluation-harness's perplexities, one row per language.

Each document is scored as lm-eval's ``loglikelihood_rolling`` scores it: tokenized with BOS as
lm-eval decides it (`eval.tokens`), cut into windows by lm-eval's rule (the first window starts
with the prefix token, BOS else EOS, and predicts the first ``max_length`` tokens; every later
window predicts the next ``max_length`` tokens, or the rest, after as much preceding text as
fits, so the last partial window sees a full window of context), every token predicted once.

Metrics: ``ppl`` (exp of the NLL per scored token), ``word_perplexity`` (per whitespace-separated
word, lm-eval's count), ``byte_perplexity`` (per UTF-8 byte), ``bits_per_byte`` (NLL / (ln 2 x
bytes), comparable across tokenizers), each with a ``_stderr`` from the spread of the
documents' NLLs (`ratio_stderr`), which localize uses as the metric's noise.

The logits of a batch are never all held at once: windows are run in slices of positions
(`LOGITS_BUDGET` bytes of float32 logits per slice), the later slices attending to the earlier
ones through the KV cache.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from eval.batching import right_pad
from eval.data import JSONL_SUFFIXES, TEXT_SUFFIXES, has_suffix, text_sha256
from eval.data import read_documents as read_file_documents
from eval.errors import EvalDataError, MissingDataError, TaskSpecError, data_error
from eval.model_loading import model_device
from eval.published import HubSource
from eval.scoring import cache_argument
from eval.tasks import Settings, TaskSpec
from eval.tokens import TextEncoder, parse_add_bos
from surgery.hub.datasets import stream_documents

# Most bytes of float32 logits one forward slice may hold (see the module docstring).
LOGITS_BUDGET = 256 * 2**20
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


def rolling_windows(
    tokens: list[int], prefix: int | None, max_length: int
) -> list[tuple[list[int], list[int]]]:
    """lm-eval's ``get_rolling_token_windows(context_len=1)`` + ``make_disjoint_window``.

    Args:
        tokens: the document's token ids (every one is predicted).
        prefix: the token the first window starts with (None: the first token is only context).
        max_length: most input tokens per window.

    Returns:
        `(context, continuation)` pairs: the model reads ``(context + continuation)[:-1]`` and
        scores every continuation token.
    """
    if prefix is None:  # nothing to condition the first token on: it is context only
        if len(tokens) < 2:
            return []
        head, tokens = [tokens[0]], tokens[1:]
    else:
        head = [prefix]
    pairs = []
    first = min(max_length, len(tokens))
    pairs.append((head + tokens[: first - 1], tokens[:first]))
    predicted = first
    while predicted < len(tokens):
        size = min(len(tokens) - predicted, max_length)
        end = predicted + size
        pairs.append((tokens[max(0, end - max_length - 1) : end - 1], tokens[end - size : end]))
        predicted = end
    # make_disjoint_window: the context stops where the continuation starts.
    return [(context[: len(context) - (len(cont) - 1)], cont) for context, cont in pairs]


def windows(ids: list[int], max_length: int) -> list[tuple[list[int], list[int]]]:
    """Rolling windows of a sequence whose first id is the prefix (as `rolling_windows`)."""
    return rolling_windows(ids[1:], ids[0], max_length)


def count_words(text: str) -> int:
    """Words as lm-eval counts them for word_perplexity: ``len(re.split(r"\\s+", text))``."""
    return len(re.split(r"\s+", text))


@torch.no_grad()
def window_loglikelihoods(
    model: Any,
    pairs: list[tuple[list[int], list[int]]],
    *,
    batch_size: int = 8,
    budget: int | None = None,
    progress: bool = False,
    desc: str = "perplexity",
) -> list[float]:
    """Summed log-probability of each window's continuation after its context.

    Args:
        model: a causal LM in eval mode.
        pairs: `(context, continuation)` windows, inputs at most the model's length.
        batch_size: windows per forward.
        budget: most bytes of float32 logits per forward slice (default `LOGITS_BUDGET`).
        progress: show a progress bar.
        desc: its label.

    Returns:
        One float per window, in order.
    """
    order = sorted(range(len(pairs)), key=lambda i: -len(pairs[i][0]) - len(pairs[i][1]))
    results = [0.0] * len(pairs)
    device = model_device(model)
    vocab = output_size(model)
    starts = range(0, len(order), batch_size)
    for start in tqdm(starts, desc=desc, disable=not progress, leave=False):
        indices = order[start : start + batch_size]
        rows = [pairs[i][0] + pairs[i][1] for i in indices]
        ids, mask = right_pad([row[:-1] for row in rows], device)
        targets, _ = right_pad([row[1:] for row in rows], device)
        # Scored positions: the last len(continuation) inputs of each row.
        scored = torch.zeros_like(mask)
        for r, i in enumerate(indices):
            width = len(rows[r]) - 1
            scored[r, width - len(pairs[i][1]) : width] = 1
        width = max(1, (budget or LOGITS_BUDGET) // (4 * vocab * len(indices)))
        totals = _sliced_logprobs(model, ids, mask, targets, scored, width)
        for r, i in enumerate(indices):
            results[i] = totals[r]
    return results


def _sliced_logprobs(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    targets: torch.Tensor,
    scored: torch.Tensor,
    width: int,
) -> list[float]:
    """Sum of log p(target) over scored positions, `width` positions per forward."""
    totals = torch.zeros(ids.shape[0], dtype=torch.float64, device=ids.device)
    cache = None
    for start in range(0, ids.shape[1], width):
        stop = min(start + width, ids.shape[1])
        kwargs: dict[str, Any] = {}
        if cache is not None:
            kwargs[cache_argument(model)] = cache
        positions = torch.arange(start, stop, device=ids.device).expand(ids.shape[0], -1)
        out = model(
            input_ids=ids[:, start:stop],
            attention_mask=mask[:, :stop],
            position_ids=positions,
            use_cache=stop < ids.shape[1],
            **kwargs,
        )
        if stop < ids.shape[1]:
            cache = getattr(out, "cache", None)
            if cache is None:
                cache = out.past_key_values
        logprobs = torch.log_softmax(out.logits.float(), dim=-1)  # [rows, width, vocab]
        del out
        picked = logprobs.gather(-1, targets[:, start:stop].unsqueeze(-1)).squeeze(-1)
        totals += (picked.double() * scored[:, start:stop]).sum(-1)
    return totals.tolist()


def output_size(model: Any) -> int:
    """Rows of the output embedding: the width of one position's logits."""
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    config = getattr(model.config, "text_config", None) or model.config
    return int(config.vocab_size)


def document_loglikelihoods(
    model: Any,
    encoder: TextEncoder,
    documents: list[str],
    max_length: int,
    *,
    batch_size: int = 8,
    budget: int | None = None,
    progress: bool = False,
    desc: str = "perplexity",
) -> list[tuple[float, int]]:
    """Each document's rolling log-likelihood (natural log) and number of scored tokens."""
    per_doc = [rolling_windows(encoder(doc), encoder.prefix_id, max_length) for doc in documents]
    flat = [pair for pairs in per_doc for pair in pairs]
    scores = window_loglikelihoods(
        model, flat, batch_size=batch_size, budget=budget, progress=progress, desc=desc
    )
    result, at = [], 0
    for pairs in per_doc:
        total = sum(scores[at : at + len(pairs)])
        result.append((total, sum(len(cont) for _, cont in pairs)))
        at += len(pairs)
    return result


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
