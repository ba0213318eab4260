"""Read safetensors checkpoints from headers alone: every tensor -> (file, dtype, shape, bytes).

No tensor data is read here. A safetensors file is an 8-byte little-endian header length, a JSON
header mapping names to {dtype, shape, data_offsets}, then the data buffer; offsets are relative
to the buffer's start. Every header is validated as safetensors' own loader would, and more
strictly where a lenient reading could hide a corrupt file.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import ClassVar

from surgery.core.dtypes import bits, is_float, is_known, nbytes, require_little_endian
from surgery.core.errors import CheckpointError
from surgery.core.layers import Stack, find_stacks, format_layers
from surgery.engine.header_json import USIZE_LIMIT, HeaderError, is_utf8, parse_header
from surgery.engine.progress import notice
from surgery.engine.source import ByteSource, LocalFile, Opener

INDEX_NAME = "model.safetensors.index.json"
RECIPE_NAME = "surgery_recipe.json"
# Files that describe a checkpoint, not a model: never copied from an input into an output.
CARD_NAME = "README.md"
RESULTS_NAME = "eval_results.json"
MERGEKIT_CONFIG_NAME = "mergekit_config.yml"  # the equivalent mergekit config of an output
TRAIN_RECORD = "surgery_train.json"  # a `surgery train` output's own training record
ADAPTER_CONFIG = "adapter_config.json"  # a PEFT adapter's config (`surgery extract-lora`)
# Where outputs record each shard's sha256: the index's metadata and surgery_recipe.json.
SHA256_KEY = "shard_sha256"
# The threads that made an output: a merge's in surgery_recipe.json only (no shard byte depends
# on them), a training run's in its record.
THREADS_KEY = "threads"
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
    # Whether the values are made from other tensors' bytes as they are read (a merge's
    # vocabulary permuted onto another tokenizer's, `gathered_bytes`), not read at `start`.
    gathered: ClassVar[bool] = False

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def is_float(self) -> bool:
        """Whether this tensor may be averaged."""
        return is_float(self.dtype)

    def rows(self, start: int, stop: int) -> TensorInfo:
        """Rows `start:stop` of the tensor (its first dimension): a contiguous byte range.

        Raises:
            CheckpointError: a packed dtype whose rows do not fill whole bytes.
        """
        per_row = math.prod(self.shape[1:]) * bits(self.dtype)
        if per_row % 8:
            raise _fail(self.file, f"tensor {self.name!r}: its rows do not fill whole bytes")
        first, size = self.start + start * per_row // 8, (stop - start) * per_row // 8
        shape = (stop - start, *self.shape[1:])
        return TensorInfo(self.name, self.dtype, shape, self.file, first, size)


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


def open_regular(path: Path) -> int:
    """Open `path` read-only without ever blocking: a FIFO, socket or device is refused.

    O_NONBLOCK makes opening a FIFO return at once (a plain open would wait for a writer);
    the descriptor is then checked to be a regular file before anything is read.

    Raises:
        CheckpointError: missing, unreadable, or not a regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise _fail(path, f"cannot read: {error.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _fail(path, "not a regular file (a FIFO, device or socket?); refusing to read it")
    return fd


def _read_header_json(path: Path, source: ByteSource | None = None) -> tuple[dict, int, int]:
    """Return (header dict, data start offset, file size), reading through `source` (default:
    the local file at `path`, checked to be a regular file before it is opened for reading)."""
    if source is None:
        os.close(open_regular(path))  # never block on a FIFO: refuse it first
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
        metadata, entries = parse_header(bytes(raw))
    except HeaderError as error:
        raise _fail(path, f"corrupt header ({error})") from None
    return {"__metadata__": metadata, **entries}, 8 + length, size


def _tensor_entry(path: Path, name: str, entry: dict, data_start: int) -> TensorInfo:
    """Turn one type-checked header entry (see `parse_header`) into a TensorInfo."""
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not is_known(dtype):
        raise _fail(path, f"tensor {name!r}: dtype {dtype} is not supported by this tool")
    if offsets[0] > offsets[1]:
        raise _fail(path, f"tensor {name!r}: bad data_offsets {offsets!r}")
    # As safetensors: the element count, then the bit count, must fit a 64-bit size.
    numel = 1
    for dim in shape:
        numel *= dim
        if numel >= USIZE_LIMIT:
            break
    if numel * bits(dtype) >= USIZE_LIMIT:
        raise _fail(path, f"tensor {name!r}: shape {shape} overflows a 64-bit size")
    if numel * bits(dtype) % 8:
        raise _fail(
            path,
            f"tensor {name!r}: {numel} {dtype} elements do not fill whole bytes (corrupt header)",
        )
    size = offsets[1] - offsets[0]
    if size != nbytes(dtype, numel):
        raise _fail(
            path,
            f"tensor {name!r}: {size} bytes for shape {shape} of {dtype} "
            f"(expected {nbytes(dtype, numel)})",
        )
    return TensorInfo(name, dtype, tuple(shape), path, data_start + offsets[0], size)


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
        SurgeryError: a big-endian host (every operation reads its inputs here first).
    """
    require_little_endian()
    path = Path(path)
    header, data_start, size = _read_header_json(path, source)
    metadata = header.pop("__metadata__")
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
    # Notes already shown about this checkpoint as a command's reference (`matching`): a sweep
    # plans many points from one pair of inputs and says how they match once.
    notes_shown: set[str] = field(default_factory=set, repr=False, compare=False)

    @property
    def folder(self) -> Path | None:
        """The checkpoint folder, or None for a bare .safetensors file."""
        return self.path if self.path.is_dir() else None

    @property
    def root(self) -> Path | None:
        """The folder its files may live in (`checkpoint_root`); None for a bare file."""
        folder = self.folder
        return None if folder is None else checkpoint_root(folder, self.hub)

    @cached_property
    def stacks(self) -> list[Stack]:
        """The layer stacks found in tensor names (text first), the text stack no longer than
        the config's `num_hidden_layers`; layers past it are named in a note."""
        stacks = find_stacks(self.tensors, _text_layers(self.config))
        for stack in stacks:
            if stack.beyond:
                past = format_layers(range(stack.num_layers, stack.num_layers + stack.beyond))
                notice(
                    "note",
                    f"{self.spec or self.path}: layers {past} of {stack.prefix} lie past "
                    f"config.json's num_hidden_layers ({stack.num_layers}), as a multi-token-"
                    "prediction layer does; they are outside the layer stack, which layer specs "
                    "address",
                )
        return stacks

    @cached_property
    def config(self) -> dict:
        """Its config.json, or {} when it has none (or none that parses into an object)."""
        path = self.folder / "config.json" if self.folder is not None else None
        try:
            config = json.loads(path.read_text()) if path else {}
        except (OSError, ValueError):
            return {}
        return config if isinstance(config, dict) else {}

    @cached_property
    def model_type(self) -> str | None:
        """The architecture its config.json names (`llama`, `bert`, ...), if it has one."""
        model_type = self.config.get("model_type")
        return model_type if isinstance(model_type, str) else None

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


def _text_layers(config: dict) -> int | None:
    """The text stack's layer count a config gives (`num_hidden_layers`, or its `text_config`'s
    in a multimodal config), if any."""
    for scope in (config, config.get("text_config")):
        count = scope.get("num_hidden_layers") if isinstance(scope, dict) else None
        if isinstance(count, int) and not isinstance(count, bool):
            return count
    return None


def load_index(index_path: Path) -> dict[str, str]:
    """The weight_map of an index file (name -> shard file), its paths checked by `member`.

    Raises:
        CheckpointError: unreadable, not a regular file, or not a map of strings.
    """
    try:
        with open(open_regular(index_path), "rb") as handle:
            index = json.loads(handle.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        raise _fail(index_path, f"unreadable index ({error})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise _fail(index_path, "index has no valid weight_map (name -> shard file)")
    _check_index_names(index_path, weight_map)
    return weight_map


def _check_index_names(index_path: Path, weight_map: dict[str, str]) -> None:
    """Refuse what no shard header or file name can hold, before any path is built from it: a
    lone surrogate in a name or file (not text; safetensors refuses them in headers), a NUL
    byte in a file name."""
    for name, file in weight_map.items():
        for text in (name, file):
            if not is_utf8(text):
                raise _fail(
                    index_path, f"index name {text[:60]!r} holds a lone surrogate (not text)"
                )
        if "\0" in file:
            raise _fail(index_path, f"index names {file[:60]!r}, not a file name (a NUL byte)")


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


def checkpoint_root(folder: Path, hub: HubRef | None) -> Path:
    """The folder a checkpoint's files may live in: the folder itself, or for a Hub snapshot its
    repository's cache folder (snapshot files are links into its `blobs/`), whether it was
    opened by Hub id or given as a local path into the cache."""
    return folder.parent.parent if hub is not None or is_cache_snapshot(folder) else folder


def is_cache_snapshot(folder: Path) -> bool:
    """Whether `folder` is laid out as a Hugging Face cache snapshot,
    `models--ORG--NAME/snapshots/REVISION/`, beside the repository's `blobs/`."""
    repo = folder.parent.parent
    return (
        folder.parent.name == "snapshots"
        and repo.name.startswith("models--")
        and (repo / "blobs").is_dir()
    )


def member(folder: Path, name: str, root: Path) -> Path:
    """`folder / name` for a file an index names, checked before anything is opened.

    Raises:
        CheckpointError: an absolute path, a `..` part, or a link that leaves `root`.
    """
    relative = Path(name)
    if not name or relative.is_absolute() or ".." in relative.parts:
        raise _fail(folder, f"index names {name!r}, outside the checkpoint folder; refusing it")
    path = folder / relative
    if not path.resolve().is_relative_to(root.resolve()):
        raise _fail(folder, f"{name} links outside the checkpoint folder; refusing it")
    return path


def openers(checkpoints: Iterable[Checkpoint]) -> dict[Path, Opener]:
    """How to open the files of `checkpoints` that are not on disk (for a `SourcePool`)."""
    return {path: opener for ckpt in checkpoints for path, opener in ckpt.openers.items()}


def _present(path: Path, remote: Mapping[Path, Opener]) -> bool:
    """Whether a shard file is there (on disk or remote); an unusable name (too long, say) is
    an error here, not a traceback from `Path.exists`."""
    try:
        return path in remote or path.exists()
    except OSError as error:
        raise _fail(path, f"cannot read: {error.strerror}") from None


def _shard_files(
    folder: Path, remote: Mapping[Path, Opener], root: Path | None = None
) -> tuple[list[Path], dict[str, str] | None]:
    """The shard files of a folder and its weight map (None when the folder has no index);
    files in `remote` count as present. Index paths must stay inside `root` (default: the
    folder), checked before anything is opened."""
    index_path = folder / INDEX_NAME
    if not index_path.is_file():
        others = sorted(folder.glob("*.safetensors.index.json"))
        index_path = others[0] if len(others) == 1 else index_path
    if index_path.is_file():
        weight_map = load_index(index_path)
        if not weight_map:
            raise _fail(index_path, "the index's weight_map is empty (it maps no tensor)")
        files = sorted(set(weight_map.values()))
        paths = [member(folder, f, root or folder) for f in files]
        missing = [f for f, p in zip(files, paths, strict=True) if not _present(p, remote)]
        if missing:
            raise _fail(folder, f"index names shard(s) that are missing: {', '.join(missing)}")
        return paths, weight_map
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
        files, weight_map = _shard_files(path, remote, checkpoint_root(path, hub))
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
