"""Hub dataset references (one grammar for `surgery eval -t` and `surgery train --data`) and
fetching only the files a reader needs, through huggingface_hub's cache.

Grammar: ``hub:ID[#CONFIG][@SPLIT[@REVISION]]``, e.g. ``hub:facebook/belebele#eng_Latn@test``
or ``hub:openlanguagedata/flores_plus@devtest@v2.1`` (REVISION: a branch, tag or commit).

Files are fetched with `snapshot_download` and only the patterns asked for, so HF_ENDPOINT,
HF_TOKEN, HF_HUB_OFFLINE and the cache behave as in every Hugging Face tool: a dataset fetched
beforehand with ``hf download --repo-type dataset ID --include ...`` is read offline.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HUB_PREFIX = "hub:"
CARD = "README.md"


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
    """No progress bars while fetching a benchmark's few small files (the eval has its own)."""
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    was_disabled = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            enable_progress_bars()


@contextmanager
def dataset_errors(ref: DatasetRef, error: type[Exception]) -> Iterator[None]:
    """huggingface_hub's errors about a dataset as one line of `error` that says what to do."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
        return
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
    except (HfHubHTTPError, OSError) as caught:
        message = f"could not be fetched from the Hub ({type(caught).__name__}: {caught})"
    raise error(f"dataset {ref.repo} {message}".splitlines()[0])


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
