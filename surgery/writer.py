"""Execute a plan: stream every output tensor into safetensors shards in bounded chunks.

Headers are computed from the plan before any data is written, so each shard is written front to
back exactly once. Copies go through `copy_file_range` (in the kernel: no decode, no user-space
buffer); blends read each source chunk into one reused buffer, accumulate in float32 (float64 for
32-bit inputs) and round once to the output dtype. Memory therefore stays at a few chunk-sized
buffers whatever the model or tensor size.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from surgery.dtypes import CONFIG_NAMES, TORCH_DTYPES, accumulator_for, itemsize
from surgery.errors import OutputError
from surgery.output_dir import staged_output
from surgery.plan import OutputTensor, Plan
from surgery.reader import INDEX_NAME, RECIPE_NAME
from surgery.source import SourcePool

# Elements per blend chunk: 4M elements = 16 MiB of float32 accumulator per chunk.
CHUNK_ELEMENTS = 4 * 2**20
# Bytes per copy_file_range call (the kernel moves them; this only bounds each syscall).
COPY_CHUNK = 64 * 2**20
DEFAULT_MAX_SHARD_SIZE = 5 * 10**9

# Companion files never copied from an input: weights (ours are rewritten), the input's recipe
# and model card (they describe the input, not the output).
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
_SKIP_NAMES = {INDEX_NAME, RECIPE_NAME, "README.md", ".gitattributes"}


def parse_size(text: str | int) -> int:
    """Parse a shard size such as `5GB`, `500MB`, `2GiB` or a byte count."""
    if isinstance(text, int):
        return text
    units = {
        "": 1,
        "B": 1,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "TB": 10**12,
        "KIB": 2**10,
        "MIB": 2**20,
        "GIB": 2**30,
        "TIB": 2**40,
    }
    cleaned = text.strip().upper().replace(" ", "")
    number = cleaned.rstrip("KMGTIB")
    unit = cleaned[len(number) :]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or value <= 0:
        raise OutputError(f"cannot parse size {text!r}; write e.g. 5GB, 500MB or 2GiB")
    return int(value * units[unit])


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
    item size.
    """
    ordered = sorted(tensors, key=lambda t: -itemsize(t.dtype))
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


def _write_all(fd: int, data: memoryview) -> None:
    while len(data):
        data = data[os.write(fd, data) :]


class _TensorWriter:
    """Writes output tensors to an open file; owns the reused chunk buffers."""

    def __init__(self, pool: SourcePool, progress: tqdm) -> None:
        self.pool = pool
        self.progress = progress
        self.read_buffer = bytearray()
        self.accumulators: dict[torch.dtype, torch.Tensor] = {}
        self.kernel_copy = True

    def write(self, fd: int, tensor: OutputTensor) -> None:
        if tensor.is_copy:
            self._copy(fd, tensor)
        else:
            self._blend(fd, tensor)

    def _read(self, nbytes: int) -> memoryview:
        if len(self.read_buffer) < nbytes:
            self.read_buffer = bytearray(nbytes)
        return memoryview(self.read_buffer)[:nbytes]

    def _copy(self, fd: int, tensor: OutputTensor) -> None:
        source = tensor.sources[0].tensor
        handle = self.pool.get(source.file)
        done = 0
        while done < source.nbytes:
            count = min(COPY_CHUNK, source.nbytes - done)
            if self.kernel_copy:
                try:
                    count = os.copy_file_range(handle.fd, fd, count, source.start + done)
                except OSError as error:
                    if error.errno not in (
                        errno.EXDEV,
                        errno.ENOSYS,
                        errno.EINVAL,
                        errno.EOPNOTSUPP,
                    ):
                        raise
                    self.kernel_copy = False  # e.g. across file systems on old kernels
                    continue
                if count == 0:
                    handle.read_into(source.start + done, self._read(1))  # raises: truncated
            else:
                view = self._read(min(count, CHUNK_ELEMENTS * 4))
                handle.read_into(source.start + done, view)
                _write_all(fd, view)
                count = len(view)
            done += count
            self.progress.update(count)

    def _blend(self, fd: int, tensor: OutputTensor) -> None:
        acc_dtype = max(
            (accumulator_for(s.tensor.dtype) for s in tensor.sources),
            key=lambda d: d.itemsize,
        )
        acc_dtype = max(acc_dtype, accumulator_for(tensor.dtype), key=lambda d: d.itemsize)
        numel = tensor.nbytes // itemsize(tensor.dtype)
        if acc_dtype not in self.accumulators:
            self.accumulators[acc_dtype] = torch.empty(CHUNK_ELEMENTS, dtype=acc_dtype)
        for start in range(0, numel, CHUNK_ELEMENTS):
            count = min(CHUNK_ELEMENTS, numel - start)
            acc = self.accumulators[acc_dtype][:count].zero_()
            for source in tensor.sources:
                info, size = source.tensor, itemsize(source.tensor.dtype)
                view = self._read(count * size)
                self.pool.get(info.file).read_into(info.start + start * size, view)
                values = torch.frombuffer(view, dtype=TORCH_DTYPES[info.dtype], count=count)
                acc.add_(values, alpha=source.weight)  # promotes to the accumulator dtype
            if tensor.divisor != 1.0:
                acc.div_(tensor.divisor)
            out = acc.to(TORCH_DTYPES[tensor.dtype])
            _write_all(fd, memoryview(out.view(torch.uint8).numpy()))
            self.progress.update(out.nbytes)


def _write_shard(
    path: Path, header: bytes, tensors: Sequence[OutputTensor], writer: _TensorWriter
) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_all(fd, memoryview(header))
        for tensor in tensors:
            writer.write(fd, tensor)
        expected = len(header) + sum(t.nbytes for t in tensors)
        actual = os.fstat(fd).st_size
        if actual != expected:  # a bug, not a user error: never leave such a shard behind
            raise RuntimeError(f"{path.name}: wrote {actual} bytes, expected {expected}")
    finally:
        os.close(fd)


def copy_companion_files(plan: Plan, staging: Path) -> list[str]:
    """Copy config, generation config, tokenizer and other small files; patch the config's dtype
    when --dtype changed it. Returns the names copied."""
    folder = plan.files_from.folder
    if folder is None:
        return []
    copied = []
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.name in _SKIP_NAMES or path.name.endswith(_SKIP_SUFFIXES):
            continue
        shutil.copy2(path, staging / path.name)
        copied.append(path.name)
    config = staging / "config.json"
    if plan.dtype in CONFIG_NAMES and config.is_file():
        _patch_config_dtype(config, CONFIG_NAMES[plan.dtype])
    return copied


def _patch_config_dtype(config_path: Path, name: str) -> None:
    config = json.loads(config_path.read_text())
    for section in [config, *(v for v in config.values() if isinstance(v, dict))]:
        for key in ("dtype", "torch_dtype"):
            if key in section:
                section[key] = name
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def _check_disk_space(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise OutputError(
            f"the output needs {needed / 1e9:.2f} GB but {folder} has {free / 1e9:.2f} GB free"
        )


def execute(
    plan: Plan, out: Path, *, quiet: bool = False, max_shard_size: int = DEFAULT_MAX_SHARD_SIZE
) -> Path:
    """Write the plan's output checkpoint at `out` (checked by the caller with `check_output`).

    Returns:
        The output folder.

    Raises:
        OutputError: too little disk space; any error leaves nothing at `out`.
    """
    shards = layout_shards(plan.tensors, max_shard_size)
    names = shard_names(len(shards))
    recipe_text = json.dumps(plan.recipe, sort_keys=True)
    headers = [build_header(s, {"format": "pt", "surgery_recipe": recipe_text}) for s in shards]
    with staged_output(Path(out)) as staging:
        _check_disk_space(staging, plan.total_bytes)
        bar = tqdm(
            total=plan.total_bytes,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=plan.operation,
            disable=quiet,
            file=sys.stderr,
            leave=False,
        )
        with SourcePool() as pool, bar:
            writer = _TensorWriter(pool, bar)
            for name, (header, ordered) in zip(names, headers, strict=True):
                _write_shard(staging / name, header, ordered, writer)
        if len(shards) > 1:
            _write_index(staging, plan, shards, names)
        copy_companion_files(plan, staging)
        (staging / RECIPE_NAME).write_text(json.dumps(plan.recipe, indent=2, sort_keys=True) + "\n")
    return Path(out)


def _write_index(
    staging: Path, plan: Plan, shards: list[list[OutputTensor]], names: list[str]
) -> None:
    weight_map = {t.name: name for name, shard in zip(names, shards, strict=True) for t in shard}
    index = {
        "metadata": {
            "total_size": plan.total_bytes,
            "total_parameters": sum(t.nbytes // itemsize(t.dtype) for t in plan.tensors),
        },
        "weight_map": dict(sorted(weight_map.items())),
    }
    (staging / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
