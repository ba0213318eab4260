"""A Hub file read by HTTP range requests: the byte source behind Hub ids (no whole download).

Requests go to the file's `resolve` URL pinned to a commit sha, through huggingface_hub's
configured session and headers (HF_ENDPOINT, HF_TOKEN or the stored token, proxies, offline
mode). A read asks for exactly the bytes the engine needs, so a revert fetches only the tensors
it copies; the first read of a file fetches its first `HEAD_PROBE` bytes at once, so the 8-byte
length prefix and the JSON header usually cost one request. A connection that drops part way is
resumed from the byte where it stopped. Every response must describe the same file as the HEAD
request that opened it (size, ETag, commit): a repository that changes mid-run is an error, never
a mixed output.

The Hub answers a shard's `resolve` URL with a redirect to a signed URL on its CDN (LFS or Xet
storage), with the file's size, ETag and commit on the redirect itself. That location is taken
from the HEAD request and reused by every range request of the file, so a read costs one round
trip, not two; when the CDN refuses it (expired, 401/403/410), the `resolve` URL is asked again
and the new location checked against the same size, ETag and commit. Requests to any host but
the Hub's carry no Authorization header: the signed URL is the credential there.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from surgery.core.errors import CheckpointError

# Bytes fetched by the first read of a file: the prefix and header of most shards in one request,
# a negligible share of a shard's bytes.
HEAD_PROBE = 64 * 2**10
# Attempts in a row without progress before a read gives up; waits double from RETRY_WAIT.
RETRIES = 5
RETRY_WAIT = 0.5
_RETRY_STATUS = {429, 500, 502, 503, 504}
# What a CDN answers a signed URL it no longer honours (expired, revoked): resolve it again.
_REFUSED_STATUS = {401, 403, 410}
# The longest Retry-After obeyed (seconds); a longer one waits this long, then tries again.
MAX_RETRY_AFTER = 30.0
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


class _Retry(Exception):
    """A response that ended early or a status worth retrying."""

    def __init__(self, message: str, wait: float | None = None) -> None:
        super().__init__(message)
        self.wait = wait  # the server's Retry-After, seconds


class _Refused(Exception):
    """The CDN refused a signed URL (expired): the file's location is resolved again."""


@dataclass(frozen=True)
class RemoteFile:
    """One file of a Hub repository at one commit, as the HEAD request that found it saw it."""

    label: str  # "org/name@sha/filename", for messages
    url: str  # the resolve URL, pinned to `commit`
    size: int
    etag: str | None
    commit: str


def origin(url: str) -> tuple[str, str]:
    """(scheme, host:port) of `url`: requests carry the Hub token only to the Hub's origin."""
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


class Location:
    """Where a file's bytes are fetched from: the signed CDN URL its `resolve` URL redirected
    to (or that URL itself when the Hub serves the file), shared by every source of the file
    and renewed, once for all of them, when the CDN refuses it."""

    def __init__(self, url: str, resolve: Callable[[], str]) -> None:
        self.url = url
        self._resolve = resolve  # asks the Hub again; raises if the file is not the same
        self._lock = threading.Lock()

    def renew(self, stale: str) -> str:
        """A fresh location in place of `stale` (unless another reader renewed it already)."""
        with self._lock:
            if self.url == stale:
                self.url = self._resolve()
            return self.url


class HeadBytes:
    """The first `HEAD_PROBE` bytes of one file: fetched once, shared by every source opened on
    that file (reading the headers, then each command's reads)."""

    def __init__(self) -> None:
        self.data: bytes | None = None
        self.lock = threading.Lock()


def normalize_etag(etag: str | None) -> str | None:
    """`W/"abc"` or `"abc"` -> `abc` (as huggingface_hub compares ETags)."""
    return None if etag is None else etag.removeprefix("W/").strip('"')


class HubRangeFile:
    """A `ByteSource` over a Hub file: `read_into` by HTTP range requests, resumed on drops.

    Thread-safe: writer threads share one per file; each read is its own request.
    """

    def __init__(
        self, remote: RemoteFile, head: HeadBytes | None = None, location: Location | None = None
    ) -> None:
        from huggingface_hub import constants
        from huggingface_hub.utils import build_hf_headers, get_session

        self.remote = remote
        self.size = remote.size
        self._session = get_session()
        self._hub_headers = {**build_hf_headers(), "Accept-Encoding": "identity"}
        # Off the Hub only what any client sends: never the token (Authorization).
        self._cdn_headers = {
            k: v for k, v in self._hub_headers.items() if k.lower() != "authorization"
        }
        self._timeout = constants.HF_HUB_DOWNLOAD_TIMEOUT
        self._head = head if head is not None else HeadBytes()
        self._location = location or Location(remote.url, lambda: remote.url)

    def view(self, offset: int, nbytes: int) -> memoryview:
        """The bytes, copied into private memory (meant for small reads; tensors are sliced
        through `surgery.engine.values`, which reads them in bounded blocks)."""
        buffer = bytearray(nbytes)
        self.read_into(offset, memoryview(buffer))
        return memoryview(buffer)

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill `buffer` with the file's bytes from `offset`.

        Raises:
            CheckpointError: past the end of the file, the file changed on the Hub, or the Hub
                cannot be read (after retries).
        """
        stop = offset + len(buffer)
        if offset < 0 or stop > self.size:
            raise CheckpointError(f"{self.remote.label}: unexpected end of file (truncated?)")
        if stop <= HEAD_PROBE:
            buffer[:] = self._read_head()[offset:stop]
            return
        head = self._head.data  # bytes of the head already here are not fetched again
        if head is not None and offset < len(head):
            buffer[: len(head) - offset] = head[offset:]
            buffer, offset = buffer[len(head) - offset :], len(head)
        self._fetch(offset, buffer)

    def close(self) -> None:
        """Nothing to release: each read is its own request on huggingface_hub's shared
        session, which stays open for other files."""

    def _read_head(self) -> bytes:
        with self._head.lock:
            if self._head.data is None:
                head = bytearray(min(HEAD_PROBE, self.size))
                self._fetch(0, memoryview(head))
                self._head.data = bytes(head)
            return self._head.data

    def _fetch(self, offset: int, buffer: memoryview) -> None:
        """One range request for the whole buffer; after a drop, a new one for what is left."""
        from huggingface_hub.utils import httpx

        done, failures = 0, 0
        while done < len(buffer):
            start, end = offset + done, offset + len(buffer) - 1  # `end` inclusive, as in Range
            url = self._location.url
            on_hub = origin(url) == origin(self.remote.url)
            headers = {
                **(self._hub_headers if on_hub else self._cdn_headers),
                "Range": f"bytes={start}-{end}",
            }
            try:
                with self._session.stream(
                    "GET", url, headers=headers, timeout=self._timeout
                ) as response:
                    self._check(response, start, end, on_hub)
                    for piece in response.iter_raw():
                        take = min(len(piece), len(buffer) - done)
                        buffer[done : done + take] = piece[:take]
                        done += take
                        failures = 0  # progress: a later drop starts a fresh count
                if done < len(buffer):
                    raise _Retry("the response ended early")
            except _Refused as error:
                failures += 1
                self._give_up(failures, start, end, error)
                self._location.renew(url)  # at once: a fresh signed URL needs no waiting
            except (httpx.TransportError, _Retry) as error:
                failures += 1
                self._give_up(failures, start, end, error)
                wait = min(8.0, RETRY_WAIT * 2 ** (failures - 1))
                if isinstance(error, _Retry) and error.wait is not None:
                    wait = min(MAX_RETRY_AFTER, max(wait, error.wait))
                time.sleep(wait)

    def _give_up(self, failures: int, start: int, end: int, error: Exception) -> None:
        if failures > RETRIES:
            raise CheckpointError(
                f"{self.remote.label}: reading bytes {start}-{end} from the Hub failed "
                f"{failures} times in a row ({type(error).__name__}: {error})"
            ) from None

    def _check(self, response, start: int, end: int, on_hub: bool) -> None:
        """The response must be the asked range of the very file the HEAD request described."""
        status = response.status_code
        if status in _RETRY_STATUS:
            raise _Retry(f"HTTP {status}", _retry_after(response.headers.get("Retry-After")))
        if not on_hub and status in _REFUSED_STATUS:
            raise _Refused(f"HTTP {status} from {origin(str(response.url))[1]}")
        if status in (404, 416):
            self._changed(f"HTTP {status} for bytes {start}-{end}")
        if status >= 400:
            raise CheckpointError(f"{self.remote.label}: the Hub answered HTTP {status}")
        # The Hub's own answer (the last one naming a commit, before any redirect to a CDN)
        # carries the file's ETag and commit. A CDN's answer to the signed URL names neither
        # (its ETag is its storage's): that URL is the content the Hub described when it gave it.
        answers = [*response.history, response]
        hub = next(
            (r.headers for r in reversed(answers) if "X-Repo-Commit" in r.headers),
            response.headers if on_hub else {},
        )
        etag = normalize_etag(hub.get("X-Linked-Etag") or hub.get("ETag"))
        if self.remote.etag and etag and etag != self.remote.etag:
            self._changed(f"ETag {self.remote.etag} became {etag}")
        commit = hub.get("X-Repo-Commit")
        if commit and commit != self.remote.commit:
            self._changed(f"commit {self.remote.commit} became {commit}")
        if status == 200:
            # A server may answer a range covering the whole file with the whole file.
            length = response.headers.get("Content-Length")
            if start == 0 and end == self.size - 1 and length == str(self.size):
                return
            raise CheckpointError(
                f"{self.remote.label}: the server ignored the byte range (HTTP 200); "
                "it cannot be read by ranges, pass --download"
            )
        match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", ""))
        if match is None or (int(match[1]), int(match[2])) != (start, end):
            raise CheckpointError(
                f"{self.remote.label}: asked for bytes {start}-{end}, the server sent "
                f"{response.headers.get('Content-Range')!r}"
            )
        if int(match[3]) != self.size:
            self._changed(f"size {self.size} became {match[3]}")

    def _changed(self, what: str) -> None:
        raise file_changed(self.remote, what)


def file_changed(remote: RemoteFile, what: str) -> CheckpointError:
    """The error for a file whose Hub answers stopped describing the same content."""
    return CheckpointError(
        f"{remote.label} changed on the Hub while it was being read ({what}); "
        "nothing was written, run the command again"
    )


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header given in seconds (an HTTP date is ignored)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None
