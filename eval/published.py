"""Data sets in their published layouts: which files of a dataset repository (a local snapshot
folder, or later the Hub) hold one config's split, and reading them as rows.

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

import difflib
import fnmatch
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eval.data import JSONL_SUFFIXES, Row, has_suffix, read_jsonl
from eval.errors import EvalDataError, data_error
from surgery.hub.datasets import DatasetRef, fetch

CARD = "README.md"
PARQUET_SUFFIXES = (".parquet",)
ROW_SUFFIXES = (*JSONL_SUFFIXES, *PARQUET_SUFFIXES)


def nearby(wanted: str, found: Iterable[str], count: int = 5) -> str:
    """What exists near `wanted`: names that start with it (regional variants such as
    ``spa_latn_mexi`` for ``spa_latn``), else the closest spellings, else the first few."""
    found = sorted(set(found))
    prefix = [name for name in found if name.lower().startswith(wanted.lower())] if wanted else []
    picked = (prefix or difflib.get_close_matches(wanted, found, n=count) or found)[:count]
    if not picked:
        return "none"
    return ", ".join(picked) + (" ..." if len(prefix or found) > len(picked) else "")


def card_configs(card_text: str | None) -> dict[str, dict[str, list[str]]] | None:
    """config name -> split -> path patterns, from a dataset card's front matter (None: the card
    names no configs)."""
    if not card_text or not card_text.startswith("---"):
        return None
    try:
        meta = yaml.safe_load(card_text.split("---", 2)[1]) or {}
    except yaml.YAMLError:
        return None
    entries = meta.get("configs") if isinstance(meta, dict) else None
    if not isinstance(entries, list):
        return None
    configs: dict[str, dict[str, list[str]]] = {}
    for entry in entries:
        if isinstance(entry, dict) and "config_name" in entry:
            configs[str(entry["config_name"])] = _splits(entry.get("data_files"))
    return configs


def _splits(data_files: Any) -> dict[str, list[str]]:
    """`data_files` in any of the card's spellings -> split -> patterns (a bare pattern: train)."""
    if isinstance(data_files, str):
        return {"train": [data_files]}
    splits: dict[str, list[str]] = {}
    for item in data_files or []:
        if isinstance(item, str):
            splits.setdefault("train", []).append(item)
        elif isinstance(item, dict):
            paths = item.get("path", [])
            splits.setdefault(str(item.get("split", "train")), []).extend(
                [paths] if isinstance(paths, str) else list(paths)
            )
    return splits


def _split_of(name: str) -> str:
    stem = Path(name).name.split(".")[0]
    return stem.split("-")[0]


def _by_convention(files: list[str], config: str | None) -> dict[str, dict[str, list[str]]]:
    """configs -> splits -> files for a card without ``configs``: a config is a folder holding
    row files (or a row file's stem); without configs, the whole repository is ``default``."""
    rows = [name for name in files if has_suffix(Path(name), ROW_SUFFIXES)]
    configs: dict[str, dict[str, list[str]]] = {}
    for name in rows:
        parts = name.split("/")
        names = {*parts[:-1], parts[-1].split(".")[0]} - {"data"}
        for candidate in names if config is not None else ["default"]:
            configs.setdefault(candidate, {}).setdefault(_split_of(name), []).append(name)
    return configs


def data_files(
    dataset: str, files: list[str], card_text: str | None, config: str | None, split: str
) -> list[str]:
    """The files of a repository (paths relative to its root) that hold one config's split.

    Args:
        dataset: how the dataset is named in messages (its Hub id or folder).
        files: every file of the repository.
        card_text: its README.md, or None.
        config: the config (None: the only or ``default`` one).
        split: the split, e.g. ``test``.

    Raises:
        EvalDataError: no such config or split, or no file matches it (one line, with nearby
            configs or splits).
    """
    configs = card_configs(card_text)
    if configs is None:
        configs = _by_convention(files, config)
    name = config if config is not None else ("default" if "default" in configs else None)
    if name is None and len(configs) == 1:
        name = next(iter(configs))
    if name not in configs:
        shown = config or "(none given)"
        raise EvalDataError(
            f"dataset {dataset}: no config {shown}; configs nearby: {nearby(config or '', configs)}"
        )
    splits = configs[name]
    if split not in splits:
        raise EvalDataError(
            f"dataset {dataset}, config {name}: no split {split!r}; splits: "
            + ", ".join(sorted(splits))
        )
    matched = sorted(
        {f for pattern in splits[split] for f in files if fnmatch.fnmatchcase(f, pattern)}
    )
    if not matched:
        patterns = ", ".join(splits[split])
        raise EvalDataError(
            f"dataset {dataset}, config {name}, split {split}: no file matches {patterns}"
        )
    return matched


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
