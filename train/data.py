"""Training data: documents from files or the Hub, packed into fixed blocks, mixed by share.

Each source is read as one stream of packed blocks (documents tokenized with the tokenizer's
special tokens, an EOS appended, concatenated, cut every `block_size` tokens). `--seed` shuffles
the documents of each source through a buffer of `--shuffle-buffer` documents (a uniform
permutation of a source that fits in it; a new order on each pass), the same on every rank. A
`MixtureSchedule` decides, per optimizer step, how many blocks of the global batch come from each
source: exact shares up to rounding, with the rounding error carried to the next step so the
cumulative count never drifts by more than one block. A source with `until` is dropped after that
fraction of the steps and its share goes to the others. Because every source is its own stream,
dropping one never rewinds another: target data is never replayed because of the switch (a
source is only re-read from the start when it runs out, which is logged).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from functools import partial
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.utils.data import IterableDataset

from surgery.core import textfiles
from surgery.hub.datasets import DatasetRef, fetch, parse_dataset_ref
from surgery.hub.datasets import data_files as hub_data_files
from train.errors import TrainConfigError
from train.sources import HUB_PREFIX, DataSource

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


SUFFIXES = (".jsonl.gz", ".jsonl", ".txt")
_TOKENIZE_BATCH = 64


def _has_suffix(path: Path) -> bool:
    return path.name.endswith(SUFFIXES)


def data_files(source: DataSource) -> list[Path]:
    """The files of a local source: the file itself, or a folder's supported files, sorted.

    Raises:
        TrainConfigError: a missing path, an unsupported suffix, an empty file or folder.
    """
    path = Path(source.location)
    if not path.exists():
        raise TrainConfigError(f"data {source.name!r}: {path} does not exist")
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and _has_suffix(p))
        if not files:
            raise TrainConfigError(
                f"data {source.name!r}: folder {path} has no {', '.join(SUFFIXES)} files"
            )
    else:
        if not _has_suffix(path):
            raise TrainConfigError(
                f"data {source.name!r}: {path} is not one of {', '.join(SUFFIXES)}"
            )
        files = [path]
    empty = [f for f in files if f.stat().st_size == 0]
    if empty:
        raise TrainConfigError(f"data {source.name!r}: {empty[0]} is empty")
    return files


def _iter_text_file(path: Path) -> Iterator[str]:
    """Documents of a .txt file: blocks of lines separated by blank lines."""
    return textfiles.iter_documents(path, TrainConfigError)


def _iter_jsonl_file(path: Path) -> Iterator[str]:
    """The `text` field of each JSON line (MADLAD-400 layout), gzip or plain."""
    return textfiles.iter_documents(path, TrainConfigError)


def _parse_hub(source: DataSource) -> DatasetRef:
    """`ID[#CONFIG][@SPLIT[@REVISION]]` (eval's grammar); the split defaults to train."""
    try:
        ref = parse_dataset_ref(HUB_PREFIX + source.location)
    except ValueError as error:
        raise TrainConfigError(f"data {source.name!r}: {error}") from None
    return replace(ref, split=ref.split or "train")


def _offline() -> bool:
    from huggingface_hub import constants

    return constants.is_offline_mode()


def _iter_cached(source: DataSource, ref: DatasetRef) -> Iterator[str]:
    """Offline: the config's split as fetched beforehand into the Hub cache (`hf download`),
    read as eval reads it (the card's configs, JSON lines or Parquet ``text``)."""

    def select(files: list[str], card: str | None) -> list[str]:
        split = ref.split or "train"
        return hub_data_files(ref.repo, files, card, ref.config, split, TrainConfigError)

    fetched = fetch(ref, select, TrainConfigError)
    for name in fetched.names:
        path = fetched.folder / name
        if not name.endswith(".parquet"):
            yield from textfiles.iter_documents(path, TrainConfigError)
            continue
        import pyarrow.parquet as pq

        for text in pq.read_table(path, columns=["text"]).column("text").to_pylist():
            if isinstance(text, str) and text.strip():
                yield text


def _iter_hub(source: DataSource) -> Iterator[str]:
    ref = _parse_hub(source)
    if _offline():
        yield from _iter_cached(source, ref)
        return
    try:
        import datasets
    except ImportError:
        raise TrainConfigError(
            "Hub datasets need the `datasets` package: pip install datasets"
        ) from None
    try:
        stream = datasets.load_dataset(
            ref.repo, ref.config, split=ref.split, revision=ref.revision, streaming=True
        )
    except Exception as error:  # offline, unknown id, gated: all mean "cannot read it"
        raise TrainConfigError(
            f"data {source.name!r}: cannot open Hub dataset "
            f"{source.location!r} ({type(error).__name__}: {error})"
        ) from None
    for row in stream:
        text = row.get("text")
        if isinstance(text, str) and text.strip():
            yield text


def iter_documents(source: DataSource) -> Iterator[str]:
    """Every non-empty document of a source, in file order.

    Raises:
        TrainConfigError: unreadable files or records without text.
    """
    if source.hub:
        yield from _iter_hub(source)
        return
    for path in data_files(source):
        if path.name.endswith(".txt"):
            yield from _iter_text_file(path)
        else:
            yield from _iter_jsonl_file(path)


def check_source(source: DataSource) -> None:
    """Fail early on a missing, empty or unreadable source by reading its first document.

    Raises:
        TrainConfigError: when the source has no document with text.
    """
    if not source.hub:
        data_files(source)
    if next(iter_documents(source), None) is None:
        raise TrainConfigError(f"data {source.name!r}: {source.location} has no text")


def shuffled(documents: Iterator[str], buffer: int, rng: random.Random) -> Iterator[str]:
    """The documents in a seeded order, holding at most `buffer` of them.

    Each document enters a buffer; once it is full, a random one leaves for each that enters.
    What remains at the end is shuffled whole, so a source with at most `buffer` documents
    comes out as a uniform random permutation. `buffer` 0 keeps the order.
    """
    if buffer <= 0:
        yield from documents
        return
    held: list[str] = []
    for document in documents:
        if len(held) < buffer:
            held.append(document)
            continue
        index = rng.randrange(buffer)
        yield held[index]
        held[index] = document
    rng.shuffle(held)
    yield from held


def iter_blocks(
    source: DataSource,
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    seed: int | None = None,
    shuffle_buffer: int = 0,
    on_rerun: Callable[[int], None] | None = None,
) -> Iterator[list[int]]:
    """Endless packed blocks of a source; the source is re-read when it runs out (`on_rerun`
    is then called with the number of passes made so far).

    Args:
        source: the corpus.
        tokenizer: the base's tokenizer.
        block_size: tokens per block.
        seed: shuffles the documents (with `shuffle_buffer`); None keeps file order.
        shuffle_buffer: documents held for shuffling (see `shuffled`).

    Raises:
        TrainConfigError: when a whole pass over the source yields no token.
    """
    eos = tokenizer.eos_token_id
    buffer: list[int] = []
    for epoch in range(1_000_000_000):
        tokens = 0
        documents = iter_documents(source)
        if seed is not None:
            # A string seed is hashed stably: the same order in every process and run.
            rng = random.Random(f"{seed}/{source.name}/{epoch}")
            documents = shuffled(documents, shuffle_buffer, rng)
        while texts := list(islice(documents, _TOKENIZE_BATCH)):
            for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]:
                buffer.extend(ids)
                if eos is not None and (not ids or ids[-1] != eos):
                    buffer.append(eos)
                tokens += len(ids)
            while len(buffer) >= block_size:
                yield buffer[:block_size]
                del buffer[:block_size]
        if tokens == 0:
            raise TrainConfigError(f"data {source.name!r} produced no tokens")
        if on_rerun is not None:
            on_rerun(epoch + 1)


class MixtureSchedule:
    """Which source fills each slot of each optimizer step's global batch.

    Args:
        shares: the share of each source, summing to 1.
        until: per source, the fraction of steps it is mixed in for (None: always).
        total_steps: optimizer steps of the run.
        per_step: blocks per optimizer step (batch size x accumulation x ranks).
        seed: orders the slots within a step.
    """

    def __init__(
        self,
        shares: Sequence[float],
        until: Sequence[float | None],
        total_steps: int,
        per_step: int,
        seed: int,
    ) -> None:
        self.shares = list(shares)
        self.until = list(until)
        self.total_steps = total_steps
        self.per_step = per_step
        self.seed = seed

    def active(self, step: int) -> list[int]:
        """Sources mixed in at `step` (0-based): `until` limits them to step < until * total."""
        return [i for i, u in enumerate(self.until) if u is None or step < u * self.total_steps]

    def __iter__(self) -> Iterator[list[int]]:
        """Per step, the source index of each slot, in the order the slots are consumed."""
        rng = random.Random(self.seed)
        carry = [0.0] * len(self.shares)
        previous: list[int] = []
        for step in range(self.total_steps):
            active = self.active(step)
            if active != previous:
                # New shares: start the rounding error afresh (carries always sum to zero).
                carry, previous = [0.0] * len(self.shares), active
            norm = sum(self.shares[i] for i in active)
            expected = {i: self.shares[i] / norm * self.per_step + carry[i] for i in active}
            counts = {i: max(math.floor(expected[i] + 1e-9), 0) for i in active}
            # Hand the slots floor() left over to the largest remainders (ties: source order).
            short = self.per_step - sum(counts.values())
            for i in sorted(active, key=lambda i: (counts[i] - expected[i], i))[:short]:
                counts[i] += 1
            carry = [
                expected[i] - counts[i] if i in counts else 0.0 for i in range(len(self.shares))
            ]
            slots = [i for i in active for _ in range(counts[i])]
            rng.shuffle(slots)
            yield slots


class PackedMixture(IterableDataset):
    """A torch IterableDataset of exactly `total_steps * per_step` packed blocks.

    Items are dicts with `input_ids` and `labels` (the same block; the model shifts). Documents
    are shuffled with the schedule's seed through `shuffle_buffer` documents per source.
    """

    def __init__(
        self,
        sources: Sequence[DataSource],
        tokenizer: PreTrainedTokenizerBase,
        block_size: int,
        schedule: MixtureSchedule,
        shuffle_buffer: int = 0,
    ) -> None:
        super().__init__()
        self.sources = list(sources)
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.schedule = schedule
        self.shuffle_buffer = shuffle_buffer
        self.passes: dict[str, int] = {}  # per source that ran out: the passes started over

    def rerun_notes(self) -> list[str]:
        """One line per source that ran out, with how often: said once, after training, not
        at every pass."""
        return [
            f"data {name!r} ran out {count} time(s) and was read again each time "
            f"({count + 1} passes)"
            for name, count in self.passes.items()
        ]

    def iter_tagged(self) -> Iterator[tuple[int, list[int]]]:
        """(source index, block) pairs in training order; streams open on first use."""
        streams: dict[int, Iterator[list[int]]] = {}
        for slots in self.schedule:
            for index in slots:
                if index not in streams:
                    streams[index] = iter_blocks(
                        self.sources[index],
                        self.tokenizer,
                        self.block_size,
                        self.schedule.seed,
                        self.shuffle_buffer,
                        partial(self.passes.__setitem__, self.sources[index].name),
                    )
                yield index, next(streams[index])

    def __iter__(self) -> Iterator[dict]:
        for _, block in self.iter_tagged():
            ids = torch.tensor(block, dtype=torch.long)
            yield {"input_ids": ids, "labels": ids}
