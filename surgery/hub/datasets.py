"""Hub dataset references (one grammar for `surgery eval -t` and `surgery train --data`) and
fetching only the files a reader needs, through huggingface_hub's cache.

Grammar: ``hub:ID[#CONFIG][@SPLIT[@REVISION]]``, e.g. ``hub:facebook/belebele#eng_Latn@test``
or ``hub:openlanguagedata/flores_plus@devtest@v2.1`` (REVISION: a branch, tag or commit).

Files are fetched with `snapshot_download` and only the patterns asked for, so HF_ENDPOINT,
HF_TOKEN, HF_HUB_OFFLINE and the cache behave as in every Hugging Face tool: a dataset fetched
beforehand with ``hf download --repo-type dataset ID --include ...`` is read offline.
"""

from __future__ import annotations

import difflib
import fnmatch
import gzip
import io
import itertools
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from surgery.core.textfiles import iter_documents

HUB_PREFIX = "hub:"
CARD = "README.md"
# Files a dataset's rows are read from: JSON lines (gzipped or not) and Parquet.
ROW_SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")
# Bytes per ranged request when streaming a prefix of a file (a MADLAD shard is gigabytes).
STREAM_CHUNK = 256 * 2**10


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
    rows = [name for name in files if name.endswith(ROW_SUFFIXES)]
    configs: dict[str, dict[str, list[str]]] = {}
    for name in rows:
        parts = name.split("/")
        names = {*parts[:-1], parts[-1].split(".")[0]} - {"data"}
        for candidate in names if config is not None else ["default"]:
            configs.setdefault(candidate, {}).setdefault(_split_of(name), []).append(name)
    return configs


def data_files(
    dataset: str,
    files: list[str],
    card_text: str | None,
    config: str | None,
    split: str,
    error: type[Exception] = ValueError,
    missing: type[Exception] | None = None,
) -> list[str]:
    """The files of a repository (paths relative to its root) that hold one config's split.

    Args:
        dataset: how the dataset is named in messages (its Hub id or folder).
        files: every file of the repository.
        card_text: its README.md, or None.
        config: the config (None: the only or ``default`` one).
        split: the split, e.g. ``test``.
        error: the exception raised.
        missing: the one raised when the config does not exist (default: `error`), which a
            suite may skip as a missing unit.

    Raises:
        missing: no such config (one line, with nearby configs).
        error: no such split, or no file matches it (one line, with the splits).
    """
    configs = card_configs(card_text)
    if configs is None:
        configs = _by_convention(files, config)
    name = config if config is not None else ("default" if "default" in configs else None)
    if name is None and len(configs) == 1:
        name = next(iter(configs))
    if name not in configs:
        shown = config or "(none given)"
        raise (missing or error)(
            f"dataset {dataset}: no config {shown}; configs nearby: {nearby(config or '', configs)}"
        )
    splits = configs[name]
    if split not in splits:
        raise error(
            f"dataset {dataset}, config {name}: no split {split!r}; splits: "
            + ", ".join(sorted(splits))
        )
    matched = sorted(
        {f for pattern in splits[split] for f in files if fnmatch.fnmatchcase(f, pattern)}
    )
    if not matched:
        patterns = ", ".join(splits[split])
        raise error(f"dataset {dataset}, config {name}, split {split}: no file matches {patterns}")
    return matched


@dataclass(frozen=True)
class DatasetRef:
    """A dataset on the Hub: its id, config, split and revision (None: the default)."""

    repo: str
    config: str | None = None
    split: str | None = None
    revision: str | None = None

    def __str__(self) -> str:
        text = HUB_PREFIX + self.repo + (f"#{self.config}" if self.config else "")
        if self.split or self.revision:
            text += f"@{self.split or ''}"
        return text + (f"@{self.revision}" if self.revision else "")


def is_dataset_ref(text: str) -> bool:
    """Whether `text` names a Hub dataset (``hub:...``)."""
    return text.strip().startswith(HUB_PREFIX)


def parse_dataset_ref(text: str) -> DatasetRef:
    """Parse ``hub:ID[#CONFIG][@SPLIT[@REVISION]]``.

    Raises:
        ValueError: not of that form (the message says what is wrong).
    """
    body = text.strip()
    if not body.startswith(HUB_PREFIX):
        raise ValueError(f"{text!r} is not hub:ID[#CONFIG][@SPLIT[@REVISION]]")
    body = body[len(HUB_PREFIX) :]
    body, _, at = body.partition("@")
    split, _, revision = at.partition("@")
    repo, _, config = body.partition("#")
    if repo.count("/") != 1 or any(not part for part in repo.split("/")):
        raise ValueError(f"{text!r}: {repo!r} is not a Hub dataset id such as facebook/belebele")
    if "@" in revision:
        raise ValueError(f"{text!r}: expected hub:ID[#CONFIG][@SPLIT[@REVISION]]")
    return DatasetRef(repo, config or None, split or None, revision or None)


@dataclass(frozen=True)
class Fetched:
    """The files fetched for a reader: the snapshot folder, their names in it, the commit."""

    folder: Path
    names: list[str]
    commit: str


@contextmanager
def _quiet() -> Iterator[None]:
    """No progress bars or notices while fetching a benchmark's few small files (the eval has
    its own progress bar)."""
    # Imported first: importing it sets the library logger's level, which is changed below.
    from huggingface_hub import snapshot_download  # noqa: F401
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    was_disabled = are_progress_bars_disabled()
    disable_progress_bars()
    # "No files matched allow_patterns=['README.md']" for a dataset without a card: not news.
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
        if not was_disabled:
            enable_progress_bars()


@contextmanager
def dataset_errors(
    ref: DatasetRef, error: type[Exception], missing: type[Exception] | None = None
) -> Iterator[None]:
    """huggingface_hub's errors about a dataset as one line of `error` that says what to do
    (`missing`, default `error`, for a file the repository does not have)."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    kind = error
    try:
        yield
        return
    except RemoteEntryNotFoundError as caught:
        kind = missing or error
        from urllib.parse import unquote

        url = unquote(str(caught.response.url))
        message = f"has no file {url.split('/resolve/', 1)[-1].split('/', 1)[-1]}"
    except GatedRepoError:
        message = "is gated: accept its terms on the Hub, then log in (hf auth login or HF_TOKEN)"
    except RepositoryNotFoundError:
        message = "is not a Hub dataset you can read (a typo? private: set HF_TOKEN)"
    except RevisionNotFoundError:
        message = f"has no revision {ref.revision!r} on the Hub"
    except LocalEntryNotFoundError:
        message = (
            "is not in the Hub cache and the Hub cannot be reached (HF_HUB_OFFLINE set, or no "
            f"network); fetch it first: hf download --repo-type dataset {ref.repo}"
        )
    except (HfHubHTTPError, EntryNotFoundError, OSError) as caught:
        message = f"could not be fetched from the Hub ({type(caught).__name__}: {caught})"
    raise kind(f"dataset {ref.repo} {message}".splitlines()[0])


def fetch(
    ref: DatasetRef,
    select: Callable[[list[str], str | None], list[str]],
    error: type[Exception],
) -> Fetched:
    """Fetch the files `select(repository files, card text)` names, and only those.

    Online the repository's file list comes from the Hub; offline (HF_HUB_OFFLINE) it is what
    the cache holds of that revision. Either way the files are read from the cache's snapshot
    folder, so results are the same.

    Raises:
        error: gated without a token, unknown dataset or revision, offline without the files in
            the cache, or whatever `select` raises.
    """
    from huggingface_hub import HfApi, constants, snapshot_download

    revision = ref.revision or "main"
    with dataset_errors(ref, error), _quiet():
        folder = Path(
            snapshot_download(
                ref.repo, repo_type="dataset", revision=revision, allow_patterns=[CARD]
            )
        )
        offline = constants.is_offline_mode()
        if offline:
            files = sorted(
                p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()
            )
        else:
            files = HfApi().list_repo_files(ref.repo, repo_type="dataset", revision=folder.name)
    card = folder / CARD
    names = select(files, card.read_text(encoding="utf-8") if card.is_file() else None)
    with dataset_errors(ref, error), _quiet():
        if not offline:
            snapshot_download(
                ref.repo, repo_type="dataset", revision=revision, allow_patterns=names
            )
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise error(
            f"dataset {ref.repo}: {missing[0]} is not in the Hub cache (HF_HUB_OFFLINE set); "
            f"fetch it first: hf download --repo-type dataset {ref.repo} --include {missing[0]}"
        )
    return Fetched(folder, names, folder.name)


def _snapshot(ref: DatasetRef) -> Path:
    """The cache's snapshot folder of the dataset's revision (its name is the commit); online it
    also fetches the card, offline it must be cached."""
    from huggingface_hub import snapshot_download

    revision = ref.revision or "main"
    return Path(
        snapshot_download(ref.repo, repo_type="dataset", revision=revision, allow_patterns=[CARD])
    )


def stream_documents(
    ref: DatasetRef,
    name: str,
    skip: int,
    take: int | None,
    error: type[Exception],
    missing: type[Exception] | None = None,
) -> tuple[list[str], str]:
    """Documents ``skip`` to ``skip + take`` of a JSON-lines file (``.jsonl[.gz]``, ``text``)
    of a Hub dataset, and the commit read.

    Online the file is read from its start by ranged requests and reading stops once the
    documents are taken, so bytes fetched grow with ``skip + take``, not the file's size;
    offline (HF_HUB_OFFLINE) the file fetched beforehand into the cache is read.

    Raises:
        missing: online, the repository has no such file (a language it does not hold).
        error: as `fetch`; a malformed line; offline without the file in the cache.
    """
    from huggingface_hub import constants

    stop = None if take is None else skip + take
    with dataset_errors(ref, error, missing), _quiet():
        folder = _snapshot(ref)
        if constants.is_offline_mode():
            path = folder / name
            if not path.is_file():
                raise error(
                    f"dataset {ref.repo}: {name} is not in the Hub cache (HF_HUB_OFFLINE set); "
                    f"fetch it first: hf download --repo-type dataset {ref.repo} --include {name}"
                )
            return list(itertools.islice(iter_documents(path, error), skip, stop)), folder.name
        lines = _remote_lines(ref.repo, name, folder.name)
        documents = itertools.islice(_documents(lines, f"{ref.repo}/{name}", error), skip, stop)
        return list(documents), folder.name


def _remote_lines(repo: str, name: str, commit: str) -> Iterator[bytes]:
    from huggingface_hub import hf_hub_url

    raw = io.BufferedReader(
        _Ranged(hf_hub_url(repo, name, repo_type="dataset", revision=commit)), STREAM_CHUNK
    )
    handle = gzip.GzipFile(fileobj=raw) if name.endswith(".gz") else raw
    yield from handle


def _documents(lines: Iterable[bytes], where: str, error: type[Exception]) -> Iterator[str]:
    """`iter_documents` of a JSON-lines stream: each non-blank ``text``."""
    for number, raw in enumerate(lines, start=1):
        line = raw.decode("utf-8-sig" if number == 1 else "utf-8").strip()
        if not line:
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as caught:
            raise error(f"{where}:{number}: bad JSON: {caught.msg}") from None
        text = data.get("text") if isinstance(data, dict) else None
        if not isinstance(text, str):
            raise error(f"{where}:{number}: no string 'text' field")
        if text.strip():
            yield text


class _Ranged(io.RawIOBase):
    """A remote file read front to back by HTTP range requests (with the Hub's headers)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.position = 0
        self.done = False
        self.pending = b""  # the rest of a whole body sent by a server that ignores Range

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        if self.pending:
            size = min(len(buffer), len(self.pending))
            buffer[:size], self.pending = self.pending[:size], self.pending[size:]
            return size
        if self.done or not len(buffer):
            return 0
        stop = self.position + len(buffer) - 1
        headers = {**build_hf_headers(), "Range": f"bytes={self.position}-{stop}"}
        response = get_session().get(self.url, headers=headers, follow_redirects=True)
        if response.status_code == 416:  # past the end
            self.done = True
            return 0
        hf_raise_for_status(response)
        data, self.pending = response.content[: len(buffer)], response.content[len(buffer) :]
        buffer[: len(data)] = data
        self.position += len(data)
        self.done = response.status_code == 200 or not data  # a whole body: nothing more
        return len(data)
