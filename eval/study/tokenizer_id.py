"""Which tokenizer scored a results folder, and what another tokenizer makes incomparable.

A tokenizer is identified by the sha256 of its files, not by its path (the same tokenizer lies
in other folders on other machines, and a Hub snapshot's path holds a commit hash). The files
are those that decide how text becomes tokens, hashed by name and content in sorted name order;
weights and model configs are not among them, so a checkpoint and its revert or soup (which
copy BASE's tokenizer files byte for byte) share the hash.

Token counts are all another tokenizer changes in what `surgery compare` reads: per-token
perplexity divides by them, while word and byte perplexity, accuracies and chrF score the same
text and items whatever the tokenizer. So results of other tokenizers stay comparable except in
token perplexity, which `compare` leaves out (a model whose vocabulary grew can still be
compared with its base).

This module imports neither torch nor transformers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Files that hold a tokenizer (fast tokenizers' tokenizer.json; sentencepiece's *.model; BPE's
# vocab.json and merges.txt; WordPiece's vocab.txt; tiktoken's *.tiktoken) and its special
# and added tokens. Chat templates are left out: no kind scores through one.
TOKENIZER_FILES = (
    "added_tokens.json",
    "merges.txt",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
)
TOKENIZER_SUFFIXES = (".model", ".tiktoken")
# The key in results.json's settings.
SETTING = "tokenizer_sha256"
# (kind, metric) pairs that divide by token counts: the only ones another tokenizer changes.
TOKEN_METRICS = frozenset({("ppl", "ppl")})
# What a kind's tables show instead when its token metric is left out.
REPLACEMENT = {"ppl": "byte_perplexity"}


def tokenizer_files(folder: Path) -> list[Path]:
    """The tokenizer files directly in `folder`, sorted by name (none: an empty list)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(
        path
        for path in folder.iterdir()
        if path.is_file() and (path.name in TOKENIZER_FILES or path.suffix in TOKENIZER_SUFFIXES)
    )


def tokenizer_sha256(folder: Path) -> str | None:
    """sha256 over the tokenizer files of `folder` (each file's name and sha256, in name order),
    or None when the folder holds none."""
    files = tokenizer_files(folder)
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode())
    return digest.hexdigest()


def tokenizer_folder(checkpoint: str, tokenizer: str | None) -> Path:
    """Where `surgery eval` loads the tokenizer from: `--tokenizer` if given, else the model's
    folder (a Hub id resolved to its cached snapshot, as the model loader resolves it).

    Raises:
        CheckpointError: neither a local path nor a reachable Hub repository.
    """
    from surgery.hub.resolve import resolve

    return resolve(tokenizer if tokenizer is not None else checkpoint)[0]


def refuse_token_metrics(runs: Sequence[Any], results: Sequence[tuple[Any, Any]]) -> list[str]:
    """Leave token perplexity out of `compare`'s cells when a folder's tokenizer differs from
    the base's (the first run's), and say why; the other metrics stay.

    Args:
        runs: `compare`'s runs (`.folder`, `.results.settings`), the base first.
        results: `(cell, cell result or None)` pairs; a cell result's ``point``, ``boot``,
            ``higher`` and ``primary`` are edited in place.

    Returns:
        One line naming the first folder whose tokenizer differs, or nothing.
    """
    base = runs[0].results.settings.get(SETTING)
    other = next((run for run in runs[1:] if run.results.settings.get(SETTING) != base), None)
    if other is None:
        return []
    for cell, result in results:
        if result is None:
            continue
        for name in [m for m in result.point if (cell.kind, m) in TOKEN_METRICS]:
            for values in (result.point, result.boot, result.higher):
                values.pop(name, None)
        if result.point and result.primary not in result.point:
            instead = REPLACEMENT.get(cell.kind)
            result.primary = instead if instead in result.point else next(iter(result.point))
    found = other.results.settings.get(SETTING)
    return [
        f"Token perplexity (ppl) is not compared: {other.folder} was scored with another "
        f"tokenizer than the base {runs[0].folder} ({SETTING} {_short(found)}, not "
        f"{_short(base)}); word and byte perplexity, accuracies and chrF do not depend on it."
    ]


def _short(digest: str | None) -> str:
    return "not recorded" if digest is None else digest[:12]
