"""Open a Hub checkpoint without downloading its shards: small files through the cache, shard
headers and tensors by HTTP range requests (`surgery.hub.range_source`).

The revision is resolved once to a commit sha and every later request is pinned to it, so a
branch that moves mid-run changes nothing; the recipe records that sha. A shard already complete
in the local Hub cache is read from disk. Nothing here writes to the cache except
huggingface_hub's own download of the small files.
"""

from __future__ import annotations

import fnmatch
import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from surgery.core.errors import CheckpointError
from surgery.engine.reader import INDEX_NAME, Checkpoint, HubRef, open_checkpoint
from surgery.hub.errors import hub_errors
from surgery.hub.range_source import (
    HeadBytes,
    HubRangeFile,
    Location,
    RemoteFile,
    file_changed,
    normalize_etag,
)
from surgery.hub.timeouts import bound_requests

# Requests sent at once when a checkpoint is opened: small files, and each shard not in the
# cache's HEAD request followed by its first bytes.
_PARALLEL_REQUESTS = 8


class RemoteShard:
    """Opens one Hub shard by ranges; its HEAD request is sent once, on first use, and every
    source opened afterwards checks its responses against that one answer and fetches from the
    location it redirected to (resolved again only when the CDN refuses it)."""

    def __init__(self, spec: str, repo_id: str, filename: str, commit: str) -> None:
        self.spec, self.repo_id, self.filename, self.commit = spec, repo_id, filename, commit
        self._remote: RemoteFile | None = None
        self._location: Location | None = None
        self._head = HeadBytes()
        self._lock = threading.Lock()

    def remote(self) -> RemoteFile:
        """The file as its HEAD request describes it (size, ETag, commit)."""
        from huggingface_hub import hf_hub_url

        with self._lock:
            if self._remote is None:
                url = hf_hub_url(self.repo_id, self.filename, revision=self.commit)
                meta = self._metadata(url)
                label = f"{self.repo_id}@{self.commit[:12]}/{self.filename}"
                if meta.size is None or (meta.commit_hash and meta.commit_hash != self.commit):
                    raise CheckpointError(
                        f"{label}: the Hub's answer names commit {meta.commit_hash} and size "
                        f"{meta.size}; it cannot be read by ranges, pass --download"
                    )
                self._remote = RemoteFile(label, url, meta.size, meta.etag, self.commit)
                self._location = Location(meta.location or url, self._relocate)
            return self._remote

    def _metadata(self, url: str):
        from huggingface_hub import get_hf_file_metadata

        with hub_errors(self.spec, self.commit):
            return get_hf_file_metadata(url, retry_on_errors=True)

    def _relocate(self) -> str:
        """Ask the Hub again where the file is (its signed URL expired): the answer must
        describe the same file."""
        remote = self.remote()
        meta = self._metadata(remote.url)
        seen = (meta.size, normalize_etag(meta.etag), meta.commit_hash or remote.commit)
        if seen != (remote.size, normalize_etag(remote.etag), remote.commit):
            raise file_changed(remote, f"size, ETag and commit became {seen}")
        return meta.location or remote.url

    def __call__(self) -> HubRangeFile:
        remote = self.remote()
        return HubRangeFile(remote, self._head, self._location)

    def prefetch(self) -> None:
        """Send the HEAD request, then fetch the file's first bytes (`HEAD_PROBE`: its length
        prefix and header, as a rule), so that reading the header later costs no request."""
        self().read_into(0, memoryview(bytearray(min(8, self.remote().size))))


def _small_file(name: str, companions: Sequence[str]) -> bool:
    """Whether to fetch `name` whole: the index and config always, others that match
    `companions`."""
    if name.endswith(".safetensors"):
        return False
    if name == "config.json" or name == INDEX_NAME or name.endswith(".safetensors.index.json"):
        return True
    return any(fnmatch.fnmatch(name, pattern) for pattern in companions)


def open_remote(
    spec: str, repo_id: str, revision: str | None, *, companions: Sequence[str] = ()
) -> Checkpoint | None:
    """Open Hub repository `repo_id` at `revision` with its shards read by ranges.

    Args:
        spec: what the user gave (`org/name[@revision]`), for messages and the recipe.
        repo_id: the repository.
        revision: a branch, tag or commit; None for the default branch.
        companions: patterns of small files to fetch besides config.json and the index
            (generation config, tokenizer: what an output copies).

    Returns:
        The checkpoint, or None in offline mode or when the Hub cannot be reached (the caller
        then falls back to the cache, as a download would).

    Raises:
        CheckpointError: the repository or revision does not exist or cannot be read, or a shard
            header is corrupt.
    """
    from huggingface_hub import HfApi, constants, hf_hub_download, try_to_load_from_cache
    from huggingface_hub.file_download import repo_folder_name
    from huggingface_hub.utils import httpx

    if constants.is_offline_mode():
        return None
    bound_requests()
    with hub_errors(spec, revision):
        try:
            info = HfApi().model_info(repo_id, revision=revision)
        except httpx.TransportError:
            return None  # no network: the cache, as a download would use it
        commit = info.sha
        names = sorted(s.rfilename for s in info.siblings or [] if "/" not in s.rfilename)
        repo_folder = repo_folder_name(repo_id=repo_id, repo_type="model")
        snapshot = Path(constants.HF_HUB_CACHE) / repo_folder / "snapshots" / commit
        shards = {
            snapshot / name: RemoteShard(spec, repo_id, name, commit)
            for name in names
            # A shard complete in the cache (a download finished it) is read from disk.
            if name.endswith(".safetensors")
            and not isinstance(try_to_load_from_cache(repo_id, name, revision=commit), str)
        }
        small = [
            functools.partial(hf_hub_download, repo_id, name, revision=commit)
            for name in names
            if _small_file(name, companions)
        ]
        at_once([*small, *(shard.prefetch for shard in shards.values())])
    path = snapshot if snapshot.is_dir() or len(shards) != 1 else next(iter(shards))
    return open_checkpoint(path, spec=spec, hub=HubRef(repo_id, commit), remote=shards)


def at_once(calls: Sequence[Callable[[], object]]) -> list[object]:
    """Run `calls` side by side (up to `_PARALLEL_REQUESTS` at a time), not one round trip after
    another, and return their results in order; the first call's error, in that order, is
    raised once all of them have ended."""
    if len(calls) <= 1:
        return [call() for call in calls]
    with ThreadPoolExecutor(min(_PARALLEL_REQUESTS, len(calls))) as pool:
        jobs = [pool.submit(call) for call in calls]
    return [job.result() for job in jobs]
