"""Tokenizers of a merge, built by mergekit 0.1.5's rules (`mergekit/tokenizer/`): the output
tokenizer (`union`, `base` or a model's), and where each model's embedding and head rows come
from on its vocabulary, as a row map the engine applies (`surgery.engine.ops.merge.vocabulary`).

A model lacking a token gets mergekit's default row for it: the donor's row when one model has
it, the base's when the base has it, else the mean of the models that have it, else zeros. A
`tokens:` entry chooses the row instead (a model's, zeros, another token's), and `force` replaces
it even in models that have the token. The merge method then blends every model's rows.

Tokenizers are loaded with transformers (never `trust_remote_code`); "base" is the config's
base model, or its first model when it has none. mergekit orders the other models as a Python
set (a different order in each process); here they come in the config's order.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from surgery.core.errors import SurgeryError
from surgery.engine.naming import vocab_rows
from surgery.engine.ops.merge.spec import MergeConfigError, TokenizerSpec, TokenSpec
from surgery.engine.ops.merge.vocabulary import PAD, Take, VocabularyMap
from surgery.engine.progress import notice
from surgery.engine.reader import Checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer

# The tokenizer files a checkpoint may carry (mergekit's `_copy_tokenizer` list): an output
# that gets a built tokenizer takes none of them from the donor.
TOKENIZER_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer.model",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)


@dataclass(frozen=True)
class BuiltTokenizer:
    """The output tokenizer's files (name -> bytes) and the row map of the vocabulary tensors."""

    files: dict[str, bytes]
    rows: VocabularyMap


def _load(folder: Path | None, label: str) -> Tokenizer:
    import transformers

    if folder is None:
        raise SurgeryError(f"{label} has no folder to load a tokenizer from")
    try:
        return transformers.AutoTokenizer.from_pretrained(str(folder), use_fast=True)
    except Exception as error:  # transformers raises many types for a missing tokenizer
        message = f"cannot load the tokenizer of {label}: {error}".splitlines()[0]
        raise SurgeryError(message) from None


def _size(checkpoint: Checkpoint, tokenizer: Tokenizer) -> int:
    return vocab_rows(checkpoint.config) or len(tokenizer.get_vocab())


def _stripped(tokenizer: Tokenizer, size: int, label: str) -> Tokenizer:
    """mergekit's `get_stripped_tokenizer`: the base tokenizer without the tokens whose ids
    are past its model's rows (a BPE tokenizer's vocabulary, added tokens and merges)."""
    unused = {t for t, i in tokenizer.get_vocab().items() if i >= size}
    if not unused:
        return tokenizer
    import tokenizers

    data = json.loads(tokenizer._tokenizer.to_str())
    if not tokenizer.is_fast or data["model"]["type"] != "BPE":
        raise MergeConfigError(
            f"{label}'s tokenizer has tokens past its {size} rows; only a BPE tokenizer's are "
            "dropped (as in mergekit)"
        )
    data["added_tokens"] = [e for e in data["added_tokens"] if e["id"] < size]
    data["model"]["vocab"] = {t: i for t, i in data["model"]["vocab"].items() if t not in unused}
    pairs = [m.split(" ") if isinstance(m, str) else m for m in data["model"]["merges"]]
    data["model"]["merges"] = [
        m for m, pair in zip(data["model"]["merges"], pairs, strict=True) if unused.isdisjoint(pair)
    ]
    tokenizer._tokenizer = tokenizers.Tokenizer.from_str(json.dumps(data))
    return tokenizer


def _union(base: Tokenizer, tokenizers: Sequence[Tokenizer], sizes: Sequence[int]) -> Tokenizer:
    """mergekit's `build_union_tokenizer`: the base tokenizer plus every other token."""
    import transformers

    out_vocab: dict[str, int] = {}
    added: dict[str, object] = {}
    for tokenizer, size in zip(tokenizers, sizes, strict=True):
        decoder = tokenizer.added_tokens_decoder
        added_names = {info.content for info in decoder.values()}
        for token, index in tokenizer.get_vocab().items():
            if index < size and token not in added_names:
                out_vocab.setdefault(token, len(out_vocab))
        for index, info in decoder.items():
            if index < size:
                added.setdefault(info.content, info)
    with tempfile.TemporaryDirectory() as folder:
        base.save_pretrained(folder)
        result = transformers.AutoTokenizer.from_pretrained(folder, use_fast=True)
    base_vocab = base.get_vocab()
    # Added in two batches, not one call per token as mergekit does: the same ids in the same
    # order (each batch skips tokens the tokenizer has), without rebuilding the tokenizer's
    # added vocabulary once per token (5 s for 2,000 tokens).
    result.add_tokens([t for t in out_vocab if t not in added and t not in base_vocab])
    result.add_tokens(list(added.values()))
    return result


def _output_tokenizer(
    spec: TokenizerSpec,
    base_index: int,
    tokenizers: Sequence[Tokenizer],
    sizes: Sequence[int],
    models: Sequence[str],
) -> Tokenizer:
    if spec.source == "base":
        return tokenizers[base_index]
    if spec.source == "union":
        order = [base_index] + [i for i in range(len(tokenizers)) if i != base_index]
        return _union(
            tokenizers[base_index], [tokenizers[i] for i in order], [sizes[i] for i in order]
        )
    if spec.source in models:
        return tokenizers[models.index(spec.source)]
    return _load(Path(spec.source), f"tokenizer source {spec.source}")


def _permutation(vocab_out: dict[str, int], vocab: dict[str, int], size: int) -> list[int]:
    """Each output id's row in one model, or -1 where the model lacks the token."""
    rows = [-1] * len(vocab_out)
    for token, index in vocab_out.items():
        row = vocab.get(token, -1)
        rows[index] = row if row < size else -1
    return rows


class _Rows:
    """mergekit's `PermutedVocabulary`, on rows: each model's take of each output row."""

    def __init__(self, perms: list[list[int]], vocabs: list[dict], base: int | None) -> None:
        self.perms, self.vocabs, self.base = perms, vocabs, base
        self.counts: Counter[str] = Counter()

    def default(self, token: str, index: int, spec: TokenSpec | None) -> tuple[Take, str] | None:
        """The row of a token some model lacks (or a forced one), and what it is, or None."""
        has = [m for m, p in enumerate(self.perms) if p[index] >= 0]
        if spec is None:
            if len(has) == 1:
                return ((has[0], self.perms[has[0]][index]),), f"model:{has[0]}"
            if not has:
                return (), "zero"
            if self.base is not None and self.base in has:
                return ((self.base, self.perms[self.base][index]),), f"model:{self.base}"
            return tuple((m, self.perms[m][index]) for m in has), "mean"
        return self._chosen(token, index, spec)

    def _chosen(self, token: str, index: int, spec: TokenSpec) -> tuple[Take, str] | None:
        if spec.kind == "zero":
            return (), "zero"
        if spec.kind is None:  # mergekit fails here too (NotImplementedError)
            raise MergeConfigError(f"tokenizer.tokens[{token!r}]: give the token a source")
        model = spec.model
        if spec.kind == "model_token":
            row = spec.token_id
            if row is None:
                if spec.token not in self.vocabs[model]:
                    raise MergeConfigError(
                        f"tokenizer.tokens[{token!r}]: token {spec.token!r} is not in model "
                        f"{model + 1}'s tokenizer"
                    )
                row = self.vocabs[model][spec.token]
            return ((model, row),), f"model:{model}"
        row = self.perms[model][index]
        if row < 0:
            raise MergeConfigError(
                f"tokenizer.tokens[{token!r}]: model {model + 1} does not have the token"
            )
        return ((model, row),), f"model:{model}"

    def build(self, vocab_out: dict[str, int], specs: dict[str, TokenSpec]) -> list[list]:
        models = range(len(self.perms))
        rows: list[list] = [[()] * len(vocab_out) for _ in models]
        for token, index in vocab_out.items():
            spec = specs.get(token)
            force = spec is not None and spec.force
            if not force and all(p[index] >= 0 for p in self.perms):
                for m in models:
                    rows[m][index] = ((m, self.perms[m][index]),)
                continue
            default = self.default(token, index, spec)
            if default is not None:
                self.counts[default[1]] += 1
            for m in models:
                if self.perms[m][index] >= 0 and not force:
                    rows[m][index] = ((m, self.perms[m][index]),)
                elif default is not None:
                    rows[m][index] = default[0]
        return rows


def _padded(size: int, multiple: int | None) -> int:
    if multiple and size % multiple:
        return (size // multiple + 1) * multiple
    return size


def _files(tokenizer: Tokenizer, chat_template: str | None) -> dict[str, bytes]:
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.is_file()}


def _chat_template(value: str | None, tokenizers: Sequence[Tokenizer]) -> str | None:
    """mergekit's `_set_chat_template`: `auto` (the template most models have) or a template's
    text; mergekit's named templates are not shipped here."""
    if value is None:
        return None
    if value == "auto":
        found = [t.chat_template.strip() for t in tokenizers if isinstance(t.chat_template, str)]
        return Counter(found).most_common(1)[0][0] if found else None
    if "{" not in value:
        raise MergeConfigError(
            f"chat_template {value!r}: give the template's text or auto (mergekit's named "
            "templates are not included)"
        )
    return value


def build_tokenizer(
    spec: TokenizerSpec,
    models: Sequence[str],
    checkpoints: Sequence[Checkpoint],
    base: int | None,
    chat_template: str | None = None,
    roles: Sequence[str] | None = None,
) -> BuiltTokenizer:
    """The output tokenizer of a merge and the row map of its vocabulary tensors.

    Args:
        spec: the tokenizer to build (source, per-token rows, padding).
        models: the config's model references, as `spec.source` may name one.
        checkpoints: the opened models, in that order (their folders hold the tokenizers).
        base: the base model's index, if the config has one.
        chat_template: the config's `chat_template` (set on the output tokenizer).
        roles: how the recipe names each model (default: a merge's `base`, `model2`, ...).

    Raises:
        SurgeryError: a tokenizer that cannot be loaded, a token source without the token.
    """
    labels = [f"model {m}" for m in models]
    tokenizers = [_load(c.folder, label) for c, label in zip(checkpoints, labels, strict=True)]
    sizes = [_size(c, t) for c, t in zip(checkpoints, tokenizers, strict=True)]
    base_index = base if base is not None else 0
    tokenizers[base_index] = _stripped(
        tokenizers[base_index], sizes[base_index], labels[base_index]
    )
    out = _output_tokenizer(spec, base_index, tokenizers, sizes, list(models))
    specs = dict(spec.tokens)
    existing = set(out.get_vocab())
    for token in specs:
        if token not in existing:
            out.add_tokens(token)
            existing.add(token)
    vocab_out = out.get_vocab()
    vocabs = [t.get_vocab() for t in tokenizers]
    perms = [_permutation(vocab_out, v, s) for v, s in zip(vocabs, sizes, strict=True)]
    table = _Rows(perms, vocabs, base)
    rows = table.build(vocab_out, specs)
    size = _padded(len(vocab_out), spec.pad_to_multiple_of)
    rows = [tuple(r) + (PAD,) * (size - len(vocab_out)) for r in rows]
    template = _chat_template(chat_template, tokenizers)
    if roles is None:
        roles = ["base" if i == base else f"model{i + 1}" for i in range(len(models))]
    record = _record(spec, table.counts, len(vocab_out), size, models, roles)
    files = _files(out, template)
    return BuiltTokenizer(files, VocabularyMap(tuple(rows), size, len(vocab_out), record))


def _record(
    spec: TokenizerSpec,
    counts: Counter,
    tokens: int,
    size: int,
    models: Sequence[str],
    roles: Sequence[str],
) -> dict:
    """What the recipe says: the tokenizer written and where the rows of tokens some model
    lacks (or forced ones) came from, counted per source (models by their recipe roles)."""

    def role(key: str) -> str:
        return roles[int(key.split(":")[1])] if key.startswith("model:") else key

    sources = Counter()
    for key, count in counts.items():
        sources[role(key)] += count
    named = spec.source if spec.source not in models else role(f"model:{models.index(spec.source)}")
    return {
        "source": named,
        "tokens": tokens,
        "rows": size,
        "added_rows": dict(sorted(sources.items())),
    }


# --- Detection: do the models' vocabularies differ? ---


def _tokenizer_file(checkpoint: Checkpoint) -> Path | None:
    folder = checkpoint.folder
    path = folder / "tokenizer.json" if folder is not None else None
    return path if path is not None and path.is_file() else None


def tokenizer_vocabulary(checkpoint: Checkpoint) -> dict[str, int] | None:
    """A checkpoint's vocabulary (token -> id, ids below its config's vocab_size) read from
    its tokenizer.json alone (no transformers); None when it has none that parses."""
    path = _tokenizer_file(checkpoint)
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
        model = data["model"]
        vocab = model.get("vocab") or {}
        if isinstance(vocab, list):  # Unigram: [piece, score] pairs, ids in order
            vocab = {entry[0]: i for i, entry in enumerate(vocab)}
        vocab = dict(vocab)
        vocab |= {t["content"]: t["id"] for t in data.get("added_tokens") or ()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None
    limit = vocab_rows(checkpoint.config)
    return {t: i for t, i in vocab.items() if limit is None or i < limit}


def differing_vocabulary(checkpoints: Sequence[Checkpoint], labels: Sequence[str]) -> str | None:
    """Which inputs' vocabularies differ from the first's (same ids for the same tokens), in
    words, or None when they agree or cannot be read. Equal-size vocabularies whose tokens
    differ are caught here: their rows line up, their tokens do not."""
    files = [_tokenizer_file(c) for c in checkpoints]
    one_size = len({vocab_rows(c.config) for c in checkpoints}) == 1
    if one_size and None not in files and len({f.read_bytes() for f in files}) == 1:
        return None  # one file, one size: nothing to parse
    first = tokenizer_vocabulary(checkpoints[0])
    if first is None:
        return None
    for checkpoint, label in zip(checkpoints[1:], labels[1:], strict=True):
        vocab = tokenizer_vocabulary(checkpoint)
        if vocab is not None and vocab != first:
            only = len(vocab.keys() - first.keys()) + len(first.keys() - vocab.keys())
            return (
                f"the tokenizers of {labels[0]} and {label} differ ({len(first)} and "
                f"{len(vocab)} tokens, {only} in one only)"
            )
    return None


def warn_unused_template(chat_template: str | None) -> None:
    """mergekit ignores `chat_template` when it builds no tokenizer; so does this tool."""
    if chat_template is not None:
        notice(
            "warning",
            "chat_template is ignored: no tokenizer is built (set tokenizer_source or "
            "tokenizer), so the donor's tokenizer files are copied as they are",
        )
