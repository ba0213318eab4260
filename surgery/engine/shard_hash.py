"""sha256 of a shard computed from the bytes as they are written, never by reading it back.

Writer threads write a shard's tensors at known offsets, out of order. A file's sha256 needs its
bytes in order, so each piece is hashed when the hash reaches its offset; a piece that arrives
early waits: without a copy when its bytes stay valid (a view of an input's memory map, for byte
copies), copied otherwise (a blend's reused chunk buffer). Copies that wait are bounded: past
`limit` bytes, over all the shards written side by side (they share a `PendingBytes`), a thread
blocks until a hash catches up. In each shard the thread writing the earliest unfinished tensor
blocks at most while another thread is hashing it, so this cannot deadlock; `abort` releases
every waiting thread when a write fails or the run is interrupted.
"""

from __future__ import annotations

import hashlib
import threading

# Bytes of early blend chunks held while the hash catches up (a bounded, small buffer).
PENDING_LIMIT = 32 * 2**20


class HashAborted(Exception):
    """The shard's writing was abandoned; raised in threads that were waiting on the hash."""


class PendingBytes:
    """The bytes of early pieces copied by the hashes of the shards written side by side (at
    most `limit` in all), and the lock and condition those hashes share."""

    def __init__(self, limit: int = PENDING_LIMIT) -> None:
        self.limit = limit
        self.copied = 0
        self.cond = threading.Condition()


class OrderedHash:
    """sha256 of a file whose byte ranges arrive out of order from several threads.

    The hash itself runs outside the lock, in whichever thread brings the piece it was waiting
    for (the "drainer"); other threads leave their pieces and go back to work, so hashing one
    shard overlaps with computing the next chunks instead of serializing every writer on it.
    """

    def __init__(self, pending: PendingBytes | None = None) -> None:
        self._hash = hashlib.sha256()
        self._next = 0  # the offset the hash has reached
        self._pending: dict[int, bytes | memoryview] = {}
        self._copied = 0  # bytes copied into _pending (also counted in _shared.copied)
        self._shared = pending or PendingBytes()
        self._aborted = False
        self._draining = False  # a thread is feeding pending pieces to the hash
        self._cond = self._shared.cond

    def add(self, offset: int, data: bytes | memoryview, *, stable: bool = False) -> None:
        """Account for `data`, written at `offset` (pieces never overlap).

        Args:
            stable: `data` stays valid and unchanged until the shard is done (an input's
                mapping), so an early piece is kept as it is rather than copied.

        Raises:
            HashAborted: `abort` was called.
        """
        if not len(data):
            return
        with self._cond:
            while True:
                if self._aborted:
                    raise HashAborted
                mine = offset == self._next and not self._draining
                shared = self._shared
                if mine or stable or shared.copied + len(data) <= shared.limit:
                    break
                self._cond.wait()
            if not mine:  # hashed later, by the drainer: kept (copied if it may change)
                kept = data if stable else bytes(data)
                self._count(0 if stable else len(kept))
                self._pending[offset] = kept
                return
            self._draining = True
        self._drain(data)

    def _drain(self, piece: bytes | memoryview) -> None:
        """Hash `piece` (at the current offset) and then every pending piece that follows."""
        try:
            while True:
                self._hash.update(piece)  # releases the GIL; no lock held
                with self._cond:
                    self._next += len(piece)
                    if self._aborted:
                        raise HashAborted
                    piece = self._pending.pop(self._next, None)
                    if isinstance(piece, bytes):
                        self._count(-len(piece))
                    self._cond.notify_all()
                    if piece is None:
                        self._draining = False
                        return
        except BaseException:
            with self._cond:
                self._draining = False
                self._cond.notify_all()
            raise

    def _count(self, size: int) -> None:
        """Account for `size` more (or fewer) copied bytes; the lock is held."""
        self._copied += size
        self._shared.copied += size

    def abort(self) -> None:
        """Wake every waiting thread with HashAborted; the digest is then meaningless."""
        with self._cond:
            self._aborted = True
            self._pending.clear()
            self._count(-self._copied)  # the other shards' hashes may keep copying
            self._cond.notify_all()

    def hexdigest(self, size: int) -> str:
        """The sha256 of the whole file, which must be `size` bytes long and complete."""
        with self._cond:
            if self._next != size or self._pending or self._draining:
                raise RuntimeError(f"hashed {self._next} of {size} bytes")  # a bug, not input
            return self._hash.hexdigest()
