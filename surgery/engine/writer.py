"""Execute a plan: stream every output tensor into safetensors shards in bounded chunks.

Headers are computed from the plan before any data is written, so each shard is written front to
back exactly once. Copies go through `copy_file_range` (in the kernel: no decode, no user-space
buffer; a Hub file read by ranges is read into one buffer and written with `pwrite`); blends
read each source chunk into one reused buffer, accumulate in float32 (float64 for 32-bit inputs)
and round once to the output dtype. Memory therefore stays at a few chunk-sized
buffers whatever the model or tensor size.
"""

from __future__ import annotations

import errno
import itertools
import json
import math
import os
import shutil
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from surgery.core.dtypes import CONFIG_NAMES, bits, itemsize, torch_dtype
from surgery.core.errors import OutputError
from surgery.core.threads import current_threads
from surgery.engine.allocator import keep_freed_memory
from surgery.engine.file_space import reserve
from surgery.engine.output_dir import staged_output
from surgery.engine.plan import OutputTensor, Plan
from surgery.engine.progress import byte_progress, notice
from surgery.engine.reader import (
    ADAPTER_CONFIG,
    CARD_NAME,
    INDEX_NAME,
    MERGEKIT_CONFIG_NAME,
    RECIPE_NAME,
    RESULTS_NAME,
    SHA256_KEY,
    THREADS_KEY,
    TRAIN_RECORD,
    TensorInfo,
    openers,
)
from surgery.engine.recipe import public_recipe
from surgery.engine.shard_hash import OrderedHash, PendingBytes
from surgery.engine.source import ByteSource, LocalFile, SourcePool
from surgery.engine.values import BLOCK_BYTES, StreamedValues, element_bytes, tensor_values

if TYPE_CHECKING:
    import torch

    from surgery.engine.blend import ChunkBlender

# Elements per blend chunk. 128K elements keep the float32 accumulator (512 KiB) in the CPU's
# L2 cache while every source is added into it: measured 10% faster than 64K (less Python
# overhead per byte) and twice the throughput of 4M-element chunks.
CHUNK_ELEMENTS = 2**17
# Bytes per copy_file_range call (the kernel moves them; this only bounds each syscall).
COPY_CHUNK = 64 * 2**20
DEFAULT_MAX_SHARD_SIZE = 5 * 10**9

# Companion files never copied from an input: weights (ours are rewritten), the input's recipe,
# model card, eval results and training record (they describe the input, not the output: a
# copied training record would make the output claim TRAINED's training run).
_SKIP_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".h5",
    ".msgpack",
    ".gguf",
    ".onnx",
)
_SKIP_NAMES = {
    INDEX_NAME,
    MERGEKIT_CONFIG_NAME,
    RECIPE_NAME,
    CARD_NAME,
    RESULTS_NAME,
    TRAIN_RECORD,
    ".gitattributes",
}


def layout_shards(tensors: Sequence[OutputTensor], max_shard_size: int) -> list[list[OutputTensor]]:
    """Split tensors, in order, into shards of at most `max_shard_size` bytes (a larger tensor
    gets a shard of its own), as transformers does."""
    shards: list[list[OutputTensor]] = [[]]
    size = 0
    for tensor in tensors:
        if shards[-1] and size + tensor.nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += tensor.nbytes
    return shards


def shard_names(count: int) -> list[str]:
    """Hugging Face's shard file names."""
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def build_header(
    tensors: Sequence[OutputTensor], metadata: dict[str, str]
) -> tuple[bytes, list[OutputTensor]]:
    """The header bytes (length prefix included) and the tensors in data order.

    Larger item sizes come first, as safetensors orders them, so every tensor stays aligned to its
    item size (packed sub-byte tensors last).
    """
    ordered = sorted(tensors, key=lambda t: -bits(t.dtype))
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for tensor in ordered:
        header[tensor.name] = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # pad so the data buffer starts 8-byte aligned
    return len(text).to_bytes(8, "little") + text, ordered


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


# Elements per writer job of a numpy blend or a merge kernel's map pass. A large tensor (a 525 MB
# embedding) is split so the workers compute its segments side by side, in order; whole, one
# worker would compute it while the others, soon too far ahead of the shard's hash, wait
# (measured: a 1.9 GB soup 15% faster, Model Stock 2x).
SEGMENT_ELEMENTS = 32 * CHUNK_ELEMENTS


def _parts(tensor: OutputTensor) -> list[range | None]:
    """The element ranges written as separate jobs: segments of a numpy blend or of a segmentable
    kernel's map pass (whole kernel steps), else the whole tensor (None)."""
    if tensor.is_copy or (tensor.kernel is None and _needs_torch(tensor)):
        return [None]  # copies are not split (packed dtypes have no whole-byte element)
    numel = math.prod(tensor.shape)
    if tensor.kernel is not None:
        return tensor.kernel.parts(numel, SEGMENT_ELEMENTS) if tensor.kernel.segmentable else [None]
    return [range(s, min(s + SEGMENT_ELEMENTS, numel)) for s in range(0, numel, SEGMENT_ELEMENTS)]


def read_order(shards: Sequence[Sequence[OutputTensor]]) -> list[tuple[TensorInfo, ...]]:
    """The input tensors writing `shards` reads first, as groups read side by side, in the
    order the shard writer starts its jobs: per shard, the reduction passes of segmented
    kernels, then every other tensor. A kernel's inputs are announced once, for its first pass:
    how many more passes it makes depends on its method, and a read not announced is only
    slower, while an announced read that never comes would hold the window."""
    reads: list[tuple[TensorInfo, ...]] = []
    for whole in shards:
        tensors = [piece for tensor in whole for piece, _ in tensor.segments()]
        early = [t for t in tensors if _parts(t) != [None] and _reduces(t.kernel)]
        reads += [t.kernel.inputs for t in early]
        for tensor in tensors:
            if tensor.kernel is None:
                reads.append(tuple(s.tensor for s in tensor.sources))
            elif all(tensor is not t for t in early):
                reads.append(tensor.kernel.inputs)
    return reads


def rereads_remote(plan: Plan) -> bool:
    """Whether writing `plan` reads bytes of a file not on disk more than once: a merge
    kernel's reduction passes over a Hub input read by ranges (a download reads them once)."""
    remote = {path for checkpoint in plan.inputs for path in checkpoint.openers}
    return any(
        _reduces(t.kernel) and any(i.file in remote for i in t.kernel.inputs)
        for t in plan.tensors
        if t.kernel is not None
    )


def _reduces(kernel: object) -> bool:
    """Whether a merge kernel reads its inputs in reduction passes before its map pass."""
    return bool(getattr(kernel, "reduces", False))


def _needs_torch(tensor: OutputTensor) -> bool:
    """Whether writing `tensor` takes torch: a float8 blend, or values held in memory."""
    if tensor.values is not None:
        return True
    if tensor.pieces:
        return any(_needs_torch(piece) for piece in tensor.pieces)
    if tensor.is_copy or tensor.kernel is not None:
        return False
    from surgery.engine.float_codec import CODEC_DTYPES  # numpy: only for blends

    return not {tensor.dtype, *(s.tensor.dtype for s in tensor.sources)} <= CODEC_DTYPES


class _TensorWriter:
    """Writes one output tensor at a known file offset; one per worker thread (owns its buffers).

    Every tensor's place in its shard is known from the header, so workers write with `pwrite`
    and `copy_file_range` at explicit offsets and need no coordination.
    """

    def __init__(self, pool: SourcePool, progress: tqdm) -> None:
        self.pool = pool
        self.progress = progress
        self.chunk_buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}
        self._blender: ChunkBlender | None = None
        self.copy_buffer: bytearray | None = None  # for copies from sources without a file

    def write(
        self,
        fd: int,
        tensor: OutputTensor,
        offset: int,
        hasher: OrderedHash,
        part: range | None = None,
        prepared: futures.Future | None = None,
    ) -> None:
        """Write `tensor` at byte `offset` of the open shard `fd`, feeding its bytes to `hasher`;
        only the elements in `part` when given (a segment, see `_parts`), with the kernel's
        reductions from `prepared`."""
        self.hasher = hasher
        if tensor.kernel is not None:
            state = None if prepared is None else prepared.result()
            tensor.kernel.write(self.pool, fd, offset, self.progress, hasher, part, state)
        elif tensor.values is not None:
            self._from_memory(fd, tensor, offset)
        elif tensor.is_copy:
            self._copy(fd, tensor, offset)
        elif _needs_torch(tensor):
            self._blend_float8(fd, tensor, offset)
        else:
            self._blend(fd, tensor, offset, part or range(tensor.nbytes // itemsize(tensor.dtype)))

    def _copy(self, fd: int, tensor: OutputTensor, offset: int) -> None:
        source = tensor.sources[0].tensor
        handle = self.pool.get(source.file)
        if not isinstance(handle, LocalFile):  # a Hub file read by ranges: read, then pwrite
            self._copy_by_reads(handle, fd, source, offset)
            return
        done = 0
        while done < source.nbytes:
            count = min(COPY_CHUNK, source.nbytes - done)
            try:
                count = os.copy_file_range(handle.fd, fd, count, source.start + done, offset + done)
            except OSError as error:
                if error.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                count = 0  # e.g. across file systems on old kernels: copy through the mapping
            if count == 0:
                count = min(COPY_CHUNK, source.nbytes - done)
                _pwrite_all(fd, handle.view(source.start + done, count), offset + done)
            # The kernel copied these bytes; hash them from the input's page-cache mapping.
            self.hasher.add(offset + done, handle.view(source.start + done, count), stable=True)
            done += count
            self.progress.update(count)

    def _copy_by_reads(self, handle: ByteSource, fd: int, source: TensorInfo, offset: int) -> None:
        if self.copy_buffer is None:
            self.copy_buffer = bytearray(BLOCK_BYTES)
        buffer = self.copy_buffer
        done = 0
        while done < source.nbytes:
            piece = memoryview(buffer)[: min(len(buffer), source.nbytes - done)]
            handle.read_into(source.start + done, piece)
            _pwrite_all(fd, piece, offset + done)
            self.hasher.add(offset + done, piece)  # the buffer is reused: copied if early
            done += len(piece)
            self.progress.update(len(piece))

    def blender(self) -> ChunkBlender:
        """This worker's blender, made on first use: a copy-only command (a revert) never
        imports numpy (0.15 s of start-up)."""
        if self._blender is None:
            from surgery.engine.blend import ChunkBlender

            self._blender = ChunkBlender()
        return self._blender

    def _blend(self, fd: int, tensor: OutputTensor, offset: int, part: range) -> None:
        size = itemsize(tensor.dtype)
        inputs = []
        for source in tensor.sources:
            info = source.tensor
            handle = None if info.gathered else self.pool.get(info.file)
            if isinstance(handle, LocalFile):  # this part's bytes, read ahead of its chunks
                step = itemsize(info.dtype)
                handle.will_need(info.start + part.start * step, len(part) * step)
            inputs.append((element_bytes(self.pool, info), info.dtype, source.weight))
        for start in range(part.start, part.stop, CHUNK_ELEMENTS):
            stop = min(start + CHUNK_ELEMENTS, part.stop)
            chunks = [(values[start:stop], dtype, weight) for values, dtype, weight in inputs]
            data = memoryview(self.blender().blend(tensor, chunks, tensor.divisor)).cast("B")
            _pwrite_all(fd, data, offset + start * size)
            self.hasher.add(offset + start * size, data)
            self.progress.update(len(data))

    def _blend_float8(self, fd: int, tensor: OutputTensor, offset: int) -> None:
        """`_blend` through torch, for float8 inputs or outputs (numpy has no float8)."""
        from surgery.engine.blend import accumulate, accumulator_dtype, check_finite, finish

        acc_dtype = accumulator_dtype(tensor.dtype, (s.tensor.dtype for s in tensor.sources))
        numel = tensor.nbytes // itemsize(tensor.dtype)
        if numel == 0:
            return  # a zero-element tensor has no bytes (and torch cannot view empty buffers)
        # Whole-tensor views of the memory-mapped inputs: slicing them below copies nothing.
        inputs = [(self._source_values(s.tensor), s.weight) for s in tensor.sources]
        acc_buffer = self._buffer("acc", acc_dtype)
        out_buffer = self._buffer("out", torch_dtype(tensor.dtype))
        for start in range(0, numel, CHUNK_ELEMENTS):
            stop = min(start + CHUNK_ELEMENTS, numel)
            acc, out = acc_buffer[: stop - start], out_buffer[: stop - start]
            sources = [(values[start:stop], weight) for values, weight in inputs]
            finish(accumulate(acc, sources), tensor.divisor, out)  # the one rounding
            check_finite(tensor, out, sources)
            data = memoryview(out.view(torch_dtype("U8")).numpy())
            _pwrite_all(fd, data, offset + start * out.element_size())
            self.hasher.add(offset + start * out.element_size(), data)
            self.progress.update(len(data))

    def _from_memory(self, fd: int, tensor: OutputTensor, offset: int) -> None:
        """Write a tensor held in memory: its own bytes when it is already a CPU tensor of the
        output dtype, else converted chunk by chunk (the one rounding) through a reused buffer."""
        import torch

        values = tensor.values.reshape(-1)
        out_dtype = torch_dtype(tensor.dtype)
        if values.dtype == out_dtype and values.device.type == "cpu":
            data = memoryview(values.view(torch.uint8).numpy())
            for start in range(0, len(data), COPY_CHUNK):
                chunk = data[start : start + COPY_CHUNK]
                _pwrite_all(fd, chunk, offset + start)
                # The plan holds the tensor until the shard is done: its bytes stay valid.
                self.hasher.add(offset + start, chunk, stable=True)
                self.progress.update(len(chunk))
            return
        out_buffer = self._buffer("out", out_dtype)
        for start in range(0, values.numel(), CHUNK_ELEMENTS):
            stop = min(start + CHUNK_ELEMENTS, values.numel())
            out = out_buffer[: stop - start]
            out.copy_(values[start:stop])
            data = memoryview(out.view(torch.uint8).numpy())
            _pwrite_all(fd, data, offset + start * out.element_size())
            self.hasher.add(offset + start * out.element_size(), data)
            self.progress.update(len(data))

    def _source_values(self, info: TensorInfo) -> torch.Tensor | StreamedValues:
        return tensor_values(self.pool.get(info.file), info)

    def _buffer(self, role: str, dtype: torch.dtype) -> torch.Tensor:
        if (role, dtype) not in self.chunk_buffers:
            import torch

            self.chunk_buffers[role, dtype] = torch.empty(CHUNK_ELEMENTS, dtype=dtype)
        return self.chunk_buffers[role, dtype]


class _Shard:
    """One shard being written: its descriptor, its hash and the jobs that write it."""

    def __init__(self, path: Path, size: int, pending: PendingBytes) -> None:
        self.path, self.size = path, size
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            reserve(self.fd, size)
        except OSError:
            os.close(self.fd)
            raise
        self.hasher = OrderedHash(pending)
        self.jobs: list[futures.Future] = []

    def digest(self) -> str:
        """Wait for every job (re-raising a worker's error), check the size, return the sha256."""
        for job in self.jobs:
            job.result()
        actual = os.fstat(self.fd).st_size
        if actual != self.size:  # a bug, not a user error: never leave such a shard behind
            raise RuntimeError(f"{self.path.name}: wrote {actual} bytes, expected {self.size}")
        return self.hasher.hexdigest(self.size)

    def abort(self) -> None:
        """Stop the jobs: aborting the hash stops running ones at their next chunk."""
        self.hasher.abort()
        for job in self.jobs:
            job.cancel()

    def close(self) -> None:
        """Wait for the jobs (none may write to a closed, maybe reused, descriptor), then close."""
        futures.wait(self.jobs)
        os.close(self.fd)


class _ShardWriter:
    """Writes whole shards, spreading their tensors over worker threads.

    Torch runs each small chunk on one thread (its own thread pool would synchronize on every
    64K-element op, which is slow and collapses on a busy machine); parallelism comes from
    workers writing different tensors at once. torch and the I/O calls release the GIL.

    Up to `workers` shards are written side by side: a shard's sha256 runs in order on one
    thread, so with one shard at a time a revert (byte copies, which cost less than hashing) would
    hash on one core while the others wait. The next shard's jobs queue behind the current one's,
    so a worker that runs out of work in one shard starts the next, and hashes it.
    """

    def __init__(self, pool: SourcePool, progress: tqdm, workers: int) -> None:
        self.local = threading.local()
        self.pool, self.progress, self.workers = pool, progress, workers
        self.executor = ThreadPoolExecutor(workers)
        self.pending = PendingBytes()  # bounds early copies over all the shards in flight

    def _writer(self) -> _TensorWriter:
        if not hasattr(self.local, "writer"):
            self.local.writer = _TensorWriter(self.pool, self.progress)
        return self.local.writer

    def write(self, shards: Sequence[tuple[Path, bytes, Sequence[OutputTensor]]]) -> list[str]:
        """Write every shard (path, header, tensors in data order), header first, then every
        tensor at its offset; at most `workers` shards at once.

        Returns:
            Each shard's sha256 (hex), computed from the bytes as they were written.
        """
        live: list[_Shard] = []  # started, not yet closed
        digests: list[str] = []
        try:
            for path, header, tensors in shards:
                if len(live) == self.workers:
                    digests.append(live[0].digest())
                    live.pop(0).close()
                live.append(self._start(path, header, tensors))
            while live:
                digests.append(live[0].digest())
                live.pop(0).close()
            return digests
        finally:
            # After an error: stop every shard's workers before waiting for any of them.
            for shard in live:
                shard.abort()
            for shard in live:
                shard.close()

    def _start(self, path: Path, header: bytes, tensors: Sequence[OutputTensor]) -> _Shard:
        """Open a shard, write its header and queue the jobs that write its tensors."""
        offsets = list(itertools.accumulate((t.nbytes for t in tensors), initial=len(header)))
        shard = _Shard(path, offsets[-1], self.pending)
        try:
            _pwrite_all(shard.fd, memoryview(header), 0)
            shard.hasher.add(0, header, stable=True)
            # Reductions of segmented kernels first (they write nothing, so they run side by
            # side whatever the hash is waiting for), then every write in file order.
            # A tensor made of pieces (see `OutputTensor.pieces`) is written piece by piece.
            layout = [
                (piece, offset + within, _parts(piece))
                for tensor, offset in zip(tensors, offsets, strict=False)
                for piece, within in tensor.segments()
            ]
            prepared = {
                id(t.kernel): self.executor.submit(lambda k: k.prepare_from(self.pool), t.kernel)
                for t, _, parts in layout
                if parts != [None] and t.kernel is not None
            }
            shard.jobs += prepared.values()
            shard.jobs += [
                self.executor.submit(
                    lambda t, o, p: self._writer().write(
                        shard.fd, t, o, shard.hasher, p, prepared.get(id(t.kernel))
                    ),
                    tensor,
                    offset,
                    part,
                )
                for tensor, offset, parts in layout
                for part in parts
            ]
        except BaseException:
            shard.abort()
            shard.close()
            raise
        return shard

    def close(self) -> None:
        """Stop the worker threads."""
        self.executor.shutdown(cancel_futures=True)


# Subfolders never copied: hidden ones (.git, .cache) and a training run's resumable checkpoints.
_SKIP_FOLDERS = ("checkpoints",)


def companion_files(plan: Plan) -> list[tuple[Path, str]]:
    """(source, relative name) of each config, tokenizer or other small file to copy into the
    output, subfolders included (a sentence-transformers `1_Pooling/config.json`).

    Only regular files inside the checkpoint folder qualify: a link that leaves it (say
    `notes.txt` -> a private key) is skipped with a warning, never followed, and a FIFO, socket or
    device is skipped without being opened (opening a FIFO would block).
    """
    folder = plan.files_from.folder
    if folder is None or plan.adapter is not None:
        return []
    # Links may point anywhere under the checkpoint's root (a Hub snapshot's blobs).
    root = (plan.files_from.root or folder).resolve()
    return [f for f in _companions_in(folder, folder, root) if f[1] not in plan.omit_files]


def _companions_in(folder: Path, top: Path, root: Path) -> list[tuple[Path, str]]:
    chosen = []
    for path in sorted(folder.iterdir()):
        name = path.relative_to(top).as_posix()
        if path.name in _SKIP_NAMES or path.name.endswith(_SKIP_SUFFIXES):
            continue
        target = path.resolve()
        if path.is_symlink() and not target.is_relative_to(root):
            notice("warning", f"skipped {name}: a link to {target}, outside {top}")
        elif target.is_file():
            chosen.append((target, name))
        elif target.is_dir():
            hidden = path.name.startswith(".") or path.name in _SKIP_FOLDERS
            if not hidden and not path.is_symlink():
                chosen += _companions_in(path, top, root)
        elif target.exists():
            notice("warning", f"skipped {name}: not a regular file")
    return chosen


def copy_companion_files(
    plan: Plan, staging: Path, files: Sequence[tuple[Path, str]] | None = None
) -> list[str]:
    """Copy config, generation config, tokenizer and other small files (`files`, default
    `companion_files(plan)`); patch the config's dtype when --dtype changed it. Returns the names
    copied."""
    copied = []
    for source, name in companion_files(plan) if files is None else files:
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, staging / name)
        copied.append(name)
    config = staging / "config.json"
    if plan.dtype in CONFIG_NAMES and config.is_file():
        _patch_config_dtype(config, CONFIG_NAMES[plan.dtype])
    if plan.config_updates and config.is_file():
        _update_config(config, plan.config_updates)
    return copied


def _update_config(config_path: Path, updates: dict) -> None:
    """Set top-level config.json keys (a merge of layer slices sets num_hidden_layers)."""
    config = json.loads(config_path.read_text())
    config.update(updates)
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def _patch_config_dtype(config_path: Path, name: str) -> None:
    config = json.loads(config_path.read_text())
    for section in [config, *(v for v in config.values() if isinstance(v, dict))]:
        for key in ("dtype", "torch_dtype"):
            if key in section:
                section[key] = name
    config_path.write_text(json.dumps(config, indent=2) + "\n")


# Rounding slack per file written (file systems allocate whole blocks).
_BLOCK = 4096


def bytes_needed(
    plan: Plan,
    headers: Sequence[bytes],
    companions: Sequence[tuple[Path, str]],
    extra_files: Mapping[str, str | bytes],
) -> int:
    """Everything the run writes: shards (headers and tensors), index, recipe, copied companion
    files and extra files, each rounded up by a block."""
    recipe = len(json.dumps(plan.recipe, indent=2)) + 100 * (len(headers) + 1)
    index = sum(len(t.name) + 40 for t in plan.tensors) + 100 * len(headers) + 200
    files = [plan.total_bytes + sum(map(len, headers)), recipe, index]
    files += [source.stat().st_size for source, _ in companions]
    files += [len(_encoded(text)) for text in extra_files.values()]
    return sum(files) + _BLOCK * (len(headers) + len(files))


def _encoded(text: str | bytes) -> bytes:
    return text if isinstance(text, bytes) else text.encode()


def _os_error_line(out: Path, error: OSError) -> OutputError:
    """`cannot write OUT: no space left on device` (what a user can act on, in one line)."""
    reason = (error.strerror or str(error)).lower()
    return OutputError(f"cannot write {out}: {reason}")


@contextmanager
def _single_threaded_torch(plan: Plan) -> Iterator[int]:
    """Yield the number of writer threads; while they run, torch ops use one thread each.

    A plan of byte copies never imports torch (a revert starts in a fraction of a second).
    """
    workers = current_threads()
    if not any(_needs_torch(t) for t in plan.tensors):  # copies, numpy blends and kernels
        yield workers
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield max(1, min(threads, workers))
    finally:
        torch.set_num_threads(threads)


def _kept_groups(plan: Plan, max_shard_size: int) -> list[list[OutputTensor]] | None:
    """The plan's tensors grouped as its `shard_groups` name them, in plan order; None when
    there are none, a group is larger than `max_shard_size`, or they do not cover the plan."""
    if plan.shard_groups is None:
        return None
    group_of = {name: i for i, names in enumerate(plan.shard_groups) for name in names}
    if set(group_of) != {t.name for t in plan.tensors}:
        return None
    groups: list[list[OutputTensor]] = [[] for _ in plan.shard_groups]
    for tensor in plan.tensors:
        groups[group_of[tensor.name]].append(tensor)
    groups = [group for group in groups if group]
    if any(sum(t.nbytes for t in group) > max_shard_size for group in groups):
        return None
    return groups


def plan_shards(plan: Plan, max_shard_size: int) -> tuple[list[list[OutputTensor]], list[str]]:
    """The output's shards and their file names: the plan's own layout if it has one, else its
    shard groups when each fits `max_shard_size`, else tensors split by `max_shard_size`, under
    Hugging Face's names."""
    if plan.shards is None:
        shards = _kept_groups(plan, max_shard_size) or layout_shards(plan.tensors, max_shard_size)
        return shards, shard_names(len(shards))
    by_name = {t.name: t for t in plan.tensors}
    try:
        grouped = [[by_name.pop(n) for n in names] for names in plan.shards.values()]
    except KeyError as error:  # a bug in the operation, not a user error
        raise ValueError(f"the plan's layout places {error} twice or has no such tensor") from None
    if by_name:
        raise ValueError(f"the plan's layout leaves out {sorted(by_name)[:3]}")
    return grouped, list(plan.shards)


def execute(
    plan: Plan,
    out: Path,
    *,
    quiet: bool = False,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
    extra_files: Mapping[str, str | bytes] | None = None,
    replace: bool | None = None,
    carry: Sequence[str] = (),
) -> Path:
    """Write the plan's output checkpoint at `out` (checked by the caller with `check_output`).

    Every shard's sha256, computed as its bytes are written, goes in the index's metadata and in
    surgery_recipe.json (`shard_sha256`); `surgery verify` checks them.

    Args:
        extra_files: files to add to the output by name (a model card, a merge's tokenizer),
            text or bytes, written last.
        replace: whether an existing `out` may be replaced (see `staged_output`; --force).
        carry: entries of an existing `out` to keep in the new one (training's resumable
            checkpoints); see `staged_output`.

    Returns:
        The output folder.

    Raises:
        OutputError: too little disk space, `out` appeared meanwhile, or the file system
            refused (one line: `cannot write OUT: no space left on device`); any error leaves
            nothing at `out`.
    """
    keep_freed_memory()
    shards, names = plan_shards(plan, max_shard_size)
    # The shards are published as they are: they embed the recipe without local paths.
    recipe_text = json.dumps(public_recipe(plan.recipe), sort_keys=True)
    headers = [build_header(s, {"format": "pt", "surgery_recipe": recipe_text}) for s in shards]
    extra_files = extra_files or {}
    companions = companion_files(plan)
    try:
        needed = bytes_needed(plan, [h for h, _ in headers], companions, extra_files)
        with staged_output(Path(out), replace=replace, carry=carry, needed=needed) as staging:
            bar = byte_progress(plan.total_bytes, plan.operation, quiet)
            with (
                SourcePool(openers(plan.inputs)) as pool,
                bar,
                _single_threaded_torch(plan) as workers,
            ):
                pool.expect(read_order([ordered for _, ordered in headers]))
                writer = _ShardWriter(pool, bar, workers)
                try:
                    paths = [staging / name for name in names]
                    digests = writer.write(
                        [(p, h, o) for p, (h, o) in zip(paths, headers, strict=True)]
                    )
                finally:
                    writer.close()
            hashes = dict(zip(names, digests, strict=True))
            if names != shard_names(1) and plan.adapter is None:
                _write_index(staging, plan, shards, names, hashes)
            if plan.adapter is not None:
                (staging / ADAPTER_CONFIG).write_text(json.dumps(plan.adapter, indent=2) + "\n")
            copy_companion_files(plan, staging, companions)
            # A training record names its own threads; a merge records the writer's.
            recipe = {THREADS_KEY: current_threads(), **plan.recipe, SHA256_KEY: hashes}
            (staging / RECIPE_NAME).write_text(json.dumps(recipe, indent=2, sort_keys=True) + "\n")
            for name, text in extra_files.items():
                (staging / name).write_bytes(_encoded(text))
    except OSError as error:
        raise _os_error_line(Path(out), error) from error
    return Path(out)


def _write_index(
    staging: Path,
    plan: Plan,
    shards: list[list[OutputTensor]],
    names: list[str],
    hashes: Mapping[str, str],
) -> None:
    weight_map = {t.name: name for name, shard in zip(names, shards, strict=True) for t in shard}
    index = {
        "metadata": {
            "total_size": plan.total_bytes,
            "total_parameters": sum(math.prod(t.shape) for t in plan.tensors),
            SHA256_KEY: dict(hashes),
        },
        "weight_map": dict(sorted(weight_map.items())),
    }
    (staging / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
