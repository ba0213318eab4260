"""Read safetensors checkpoints from headers alone: every tensor -> (file, dtype, shape, bytes).

No tensor data is read here. A safetensors file is an 8-byte little-endian header length, a JSON
header mapping names to {dtype, shape, data_offsets}, then the data buffer; offsets are relative
to the buffer's start. Every header is validated as safetensors' own loader would, and more
strictly where a lenient reading could hide a corrupt file.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from surgery.core.dtypes import ITEMSIZES, is_float, itemsize
from surgery.core.errors import CheckpointError
from surgery.core.layers import Stack, find_stacks
from surgery.engine.source import ByteSource, LocalFile, Opener

INDEX_NAME = "model.safetensors.index.json"
RECIPE_NAME = "surgery_recipe.json"
# Files that describe a checkpoint, not a model: never copied from an input into an output.
CARD_NAME = "README.md"
RESULTS_NAME = "eval_results.json"
# safetensors refuses headers above 100 MB; so do we, before allocating anything.
MAX_HEADER_BYTES = 100_000_000


@dataclass(frozen=True)
class HubRef:
    """Where a checkpoint resolved from a Hub id came from: repository and commit sha."""

    repo_id: str
    revision: str  # a commit sha


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: its file and the absolute byte range of its data."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    start: int  # absolute offset in `file`
    nbytes: int

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def is_float(self) -> bool:
        """Whether this tensor may be averaged."""
        return is_float(self.dtype)


@dataclass(frozen=True)
class Shard:
    """One safetensors file: its tensors in data order, its metadata and sizes."""

    path: Path
    size: int
    data_start: int  # 8 + header length
    metadata: dict[str, str]
    tensors: tuple[TensorInfo, ...]


def _fail(path: Path, message: str) -> CheckpointError:
    return CheckpointError(f"{path}: {message}")


def _read_header_json(path: Path, source: ByteSource | None = None) -> tuple[dict, int, int]:
    """Return (header dict, data start offset, file size), reading through `source` (default:
    the local file at `path`)."""
    try:
        handle = source if source is not None else LocalFile(path)
    except OSError as error:
        raise _fail(path, f"cannot read: {error.strerror}") from None
    try:
        size = handle.size
        if size < 8:
            raise _fail(path, f"only {size} bytes: too short to be a safetensors file")
        prefix = bytearray(8)
        handle.read_into(0, memoryview(prefix))
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_BYTES or 8 + length > size:
            raise _fail(path, f"header length {length} does not fit in a {size}-byte file")
        raw = bytearray(length)
        handle.read_into(8, memoryview(raw))
    except OSError as error:
        raise _fail(path, f"cannot read: {error.strerror}") from None
    finally:
        if source is None:
            handle.close()
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _fail(path, f"corrupt header (not JSON: {error})") from None
    if not isinstance(header, dict):
        raise _fail(path, "corrupt header (not a JSON object)")
    return header, 8 + length, size


def _tensor_entry(path: Path, name: str, entry: object, data_start: int) -> TensorInfo:
    """Validate one header entry and turn it into a TensorInfo."""
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        raise _fail(path, f"tensor {name!r}: entry needs dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in ITEMSIZES:
        raise _fail(path, f"tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise _fail(path, f"tensor {name!r}: bad shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and o >= 0 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise _fail(path, f"tensor {name!r}: bad data_offsets {offsets!r}")
    nbytes = offsets[1] - offsets[0]
    if nbytes != math.prod(shape) * itemsize(dtype):
        raise _fail(
            path,
            f"tensor {name!r}: {nbytes} bytes for shape {shape} of {dtype} "
            f"(expected {math.prod(shape) * itemsize(dtype)})",
        )
    return TensorInfo(name, dtype, tuple(shape), path, data_start + offsets[0], nbytes)


def read_shard(path: Path, source: ByteSource | None = None) -> Shard:
    """Parse and validate one safetensors file's header.

    Args:
        path: a .safetensors file.
        source: where its bytes come from, when not from the local file `path` (a Hub file
            read by ranges); only the header's bytes are read.

    Returns:
        The shard, tensors sorted by position in the data buffer.

    Raises:
        CheckpointError: unreadable, truncated, corrupt header, unknown dtype, a byte length that
            does not match the shape, or offsets that overlap, leave gaps, or pass the file's end.
    """
    path = Path(path)
    header, data_start, size = _read_header_json(path, source)
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise _fail(path, "corrupt header (__metadata__ must map strings to strings)")
    tensors = sorted(
        (_tensor_entry(path, name, entry, data_start) for name, entry in header.items()),
        key=lambda t: (t.start, t.nbytes),
    )
    position = data_start
    for tensor in tensors:
        if tensor.start != position:
            what = "overlaps the previous tensor" if tensor.start < position else "leaves a gap"
            raise _fail(path, f"tensor {tensor.name!r}: data_offsets {what} (corrupt header)")
        position += tensor.nbytes
    if position > size:
        raise _fail(path, f"truncated: the header needs {position} bytes, the file has {size}")
    if position < size:
        raise _fail(path, f"{size - position} bytes after the last tensor (corrupt file)")
    return Shard(path, size, data_start, metadata, tuple(tensors))


@dataclass
class Checkpoint:
    """A checkpoint described by headers only: shards, tensors by name, small companion files.

    Open with `open_checkpoint`. `tensors` keeps the on-disk order (shard by shard, by offset),
    which outputs follow.
    """

    path: Path  # the folder, or the single file (for a Hub id: its local snapshot)
    shards: list[Shard]
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    spec: str = ""  # what the user gave: a path or a Hub id
    hub: HubRef | None = None  # the repository and commit, when `spec` was a Hub id
    # Shard files that are not on disk (Hub files read by ranges) and how to open them.
    openers: dict[Path, Opener] = field(default_factory=dict)

    @property
    def folder(self) -> Path | None:
        """The checkpoint folder, or None for a bare .safetensors file."""
        return self.path if self.path.is_dir() else None

    @cached_property
    def stacks(self) -> list[Stack]:
        """The layer stacks found in tensor names (text first)."""
        return find_stacks(self.tensors)

    @property
    def total_bytes(self) -> int:
        """Bytes of tensor data."""
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def num_params(self) -> int:
        """Number of elements over all tensors."""
        return sum(t.numel for t in self.tensors.values())

    @cached_property
    def recipe(self) -> dict | None:
        """The recipe of a checkpoint this tool made, from surgery_recipe.json or shard metadata."""
        candidates = []
        if self.folder is not None and (self.folder / RECIPE_NAME).is_file():
            candidates.append((self.folder / RECIPE_NAME).read_text())
        candidates += [
            s.metadata["surgery_recipe"] for s in self.shards if "surgery_recipe" in s.metadata
        ]
        for text in candidates:
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                continue
        return None

    def __iter__(self) -> Iterator[TensorInfo]:
        return iter(self.tensors.values())


def load_index(index_path: Path) -> dict[str, str]:
    try:
        index = json.loads(index_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _fail(index_path, f"unreadable index ({error})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise _fail(index_path, "index has no valid weight_map (name -> shard file)")
    return weight_map


def index_problems(weight_map: dict[str, str], shards: list[Shard]) -> list[str]:
    """Disagreements between an index's weight_map and the shards' headers."""
    problems = []
    by_file = {s.path.name: {t.name for t in s.tensors} for s in shards}
    for name, file in weight_map.items():
        if file not in by_file:
            continue  # reported once per missing file by the caller
        if name not in by_file[file]:
            problems.append(f"index maps {name!r} to {file}, which has no such tensor")
    seen: dict[str, str] = {}
    for file, names in by_file.items():
        for name in sorted(names):
            if weight_map.get(name) != file:
                problems.append(f"{file} holds {name!r}, which the index does not map there")
            if name in seen:
                problems.append(f"{name!r} is stored in both {seen[name]} and {file}")
            seen[name] = file
    return problems


def openers(checkpoints: Iterable[Checkpoint]) -> dict[Path, Opener]:
    """How to open the files of `checkpoints` that are not on disk (for a `SourcePool`)."""
    return {path: opener for ckpt in checkpoints for path, opener in ckpt.openers.items()}


def _shard_files(
    folder: Path, remote: Mapping[Path, Opener]
) -> tuple[list[Path], dict[str, str] | None]:
    """The shard files of a folder and its weight map (None when the folder has no index);
    files in `remote` count as present."""
    index_path = folder / INDEX_NAME
    if not index_path.is_file():
        others = sorted(folder.glob("*.safetensors.index.json"))
        index_path = others[0] if len(others) == 1 else index_path
    if index_path.is_file():
        weight_map = load_index(index_path)
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (folder / f).is_file() and folder / f not in remote]
        if missing:
            raise _fail(folder, f"index names shard(s) that are missing: {', '.join(missing)}")
        return [folder / f for f in files], weight_map
    files = sorted({*folder.glob("*.safetensors"), *(p for p in remote if p.parent == folder)})
    if len(files) == 1:
        return files, None
    if not files:
        raise _fail(folder, "no .safetensors files (convert .bin checkpoints to safetensors first)")
    raise _fail(folder, f"{len(files)} .safetensors files but no {INDEX_NAME}")


def open_checkpoint(
    path: str | Path,
    *,
    spec: str = "",
    hub: HubRef | None = None,
    remote: Mapping[Path, Opener] | None = None,
) -> Checkpoint:
    """Read a local checkpoint's headers: a folder (indexed shards or one file) or a .safetensors
    file. Hub ids are resolved above the engine (`surgery.hub.resolve.open_input`).

    Args:
        path: the local folder or file.
        spec: what the user gave (a path or Hub id), for recipes; default: `path`.
        hub: the repository and commit `path` was resolved from, if any.
        remote: shard files that are not on disk and how to open them (a Hub checkpoint read by
            ranges: `path` is its snapshot folder, which holds the small files).

    Raises:
        CheckpointError: missing path, no weights, an inconsistent index, or a corrupt shard.
    """
    path = Path(path)
    spec = spec or str(path)
    remote = dict(remote or {})
    if not path.exists() and path not in remote:
        raise CheckpointError(f"{path}: no such file or folder")
    if path.is_dir():
        files, weight_map = _shard_files(path, remote)
    else:
        files, weight_map = [path], None
    shards = [_read_shard_from(f, remote.get(f)) for f in files]
    if weight_map is not None:
        problems = index_problems(weight_map, shards)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise _fail(path, f"{problems[0]}{more}")
    checkpoint = Checkpoint(path=path, shards=shards, spec=spec, hub=hub)
    checkpoint.openers = {f: remote[f] for f in files if f in remote}
    for shard in shards:
        for tensor in shard.tensors:
            if tensor.name in checkpoint.tensors:
                raise _fail(path, f"{tensor.name!r} appears in more than one shard")
            checkpoint.tensors[tensor.name] = tensor
    return checkpoint


def _read_shard_from(path: Path, opener: Opener | None) -> Shard:
    if opener is None:
        return read_shard(path)
    source = opener()
    try:
        return read_shard(path, source)
    finally:
        source.close()
