"""Data sets in their published layouts: which files of a dataset repository (a local snapshot
folder, or the Hub) hold one config's split (`surgery.hub.datasets.data_files`, shared with
train), and reading them as rows.

A dataset on the Hub without a loading script names its configs in its card's YAML front
matter (``configs: [{config_name, data_files: [{split, path}]}]``, the layout `datasets` reads);
Belebele, FLORES+ and Global-PIQA publish theirs that way. A card without ``configs`` is read
by the convention `datasets` follows for plain folders: a config is a folder (or a file stem),
a split is the part of a file's name before ``-``/``.`` (``test-00000-of-00001.parquet``).

Rows come from JSON lines (``.jsonl``, ``.jsonl.gz``) or Parquet (read with pyarrow).
Everything a reader does not find is one line that names the dataset, the config and what
exists nearby (other configs, splits or columns).

This module imports neither torch nor transformers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.data import JSONL_SUFFIXES, Row, has_suffix, read_jsonl
from eval.errors import EvalDataError, MissingDataError, data_error
from surgery.hub.datasets import DatasetRef, fetch
from surgery.hub.datasets import data_files as _data_files

CARD = "README.md"
PARQUET_SUFFIXES = (".parquet",)
ROW_SUFFIXES = (*JSONL_SUFFIXES, *PARQUET_SUFFIXES)


def data_files(
    dataset: str, files: list[str], card_text: str | None, config: str | None, split: str
) -> list[str]:
    """`surgery.hub.datasets.data_files` with eval's error types (`MissingDataError` for a
    config that does not exist)."""
    return _data_files(dataset, files, card_text, config, split, EvalDataError, MissingDataError)


def snapshot_files(folder: Path) -> list[str]:
    """Every file of a snapshot folder, relative and with ``/`` (hidden folders left out)."""
    return sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def snapshot_rows(folder: Path, config: str | None, split: str) -> tuple[list[Row], list[Path]]:
    """The rows of one config's split of a snapshot folder, and the files read.

    Raises:
        EvalDataError: no such config, split or file; unreadable rows.
    """
    card = folder / CARD
    card_text = card.read_text(encoding="utf-8") if card.is_file() else None
    names = data_files(str(folder), snapshot_files(folder), card_text, config, split)
    paths = [folder / name for name in names]
    return [row for path in paths for row in read_rows(path)], paths


@dataclass(frozen=True)
class HubSource:
    """Where a unit's rows came from on the Hub (results.json records it beside the sha256)."""

    dataset: str
    config: str | None
    split: str | None
    commit: str
    folder: Path  # the cache's snapshot folder the files were read from


def fetch_files(
    ref: DatasetRef,
    config: str | None,
    split: str | None,
    select: Callable[[list[str], str | None], list[str]],
) -> tuple[list[Path], HubSource]:
    """Fetch (or find in the Hub cache) the files `select` names; only those are fetched.

    Raises:
        EvalDataError: gated, unknown, offline without the files, or what `select` raises.
    """
    fetched = fetch(ref, select, EvalDataError)
    source = HubSource(ref.repo, config, split, fetched.commit, fetched.folder)
    return [fetched.folder / name for name in fetched.names], source


def hub_rows(
    ref: DatasetRef, config: str | None, split: str
) -> tuple[list[Row], list[Path], HubSource]:
    """The rows of one config's split of a Hub dataset, the files read and where they came from.

    Raises:
        EvalDataError: as `fetch_files` and `data_files`; unreadable rows.
    """

    def select(files: list[str], card: str | None) -> list[str]:
        return data_files(ref.repo, files, card, config, split)

    paths, source = fetch_files(ref, config, split, select)
    return [row for path in paths for row in read_rows(path)], paths, source


def task_rows(path: Path, config: str | None, split: str) -> tuple[list[Row], list[Path]]:
    """The rows of a file, or of one config's split of a snapshot folder; and the files read.

    Raises:
        EvalDataError: as `read_rows` and `snapshot_rows`.
    """
    if path.is_dir():
        return snapshot_rows(path, config, split)
    return read_rows(path), [path]


def rows_for(
    dataset: DatasetRef | None, path: Path | None, config: str | None, split: str
) -> tuple[list[Row], list[Path], HubSource | None, str | None, str]:
    """A task's rows: of a Hub dataset (its reference's config and split first), else of a
    local file or snapshot folder.

    Returns:
        `(rows, files read, Hub source or None, config read, split read)`.

    Raises:
        EvalDataError: as `hub_rows` and `task_rows`.
    """
    if dataset is not None:
        config, split = dataset.config or config, dataset.split or split
        rows, files, source = hub_rows(dataset, config, split)
        return rows, files, source, config, split
    assert path is not None  # parse_task guarantees a path or a dataset
    rows, files = task_rows(path, config, split)
    return rows, files, None, config, split


def source_config(source: HubSource) -> dict[str, Any]:
    """A Hub source as a task's config records it."""
    return {
        "dataset": source.dataset,
        "config": source.config,
        "split": source.split,
        "commit": source.commit,
    }


def read_rows(path: Path) -> list[Row]:
    """The rows of a JSON-lines or Parquet file (Row.line: the line, or the row number).

    Raises:
        EvalDataError: missing or unreadable file, no rows.
    """
    if not has_suffix(path, PARQUET_SUFFIXES):
        return read_jsonl(path)
    import pyarrow.parquet as pq  # pyarrow arrives with datasets; only Parquet readers need it

    try:
        table = pq.read_table(path)
    except FileNotFoundError:
        raise data_error(path, None, "no such file") from None
    except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
        raise data_error(path, None, f"not a readable Parquet file: {error}") from None
    rows = [Row(path, number, data) for number, data in enumerate(table.to_pylist(), 1)]
    if not rows:
        raise data_error(path, None, "empty: no rows")
    return rows
