"""verify: check every shard header, the index, and optionally every value of a checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from surgery.core.dtypes import itemsize, torch_dtype
from surgery.core.errors import CheckpointError
from surgery.engine.progress import byte_progress
from surgery.engine.reader import (
    INDEX_NAME,
    Shard,
    TensorInfo,
    index_problems,
    load_index,
    read_shard,
)
from surgery.engine.source import SourcePool

_VALUE_CHUNK = 8 * 2**20  # bytes read at a time when scanning values


@dataclass
class Report:
    """What verify found: defects make the checkpoint unusable; warnings do not."""

    path: Path
    shards: int = 0
    tensors: int = 0
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no defect was found."""
        return not self.problems


def _read_shards(files: list[Path], report: Report) -> list[Shard]:
    shards = []
    for file in files:
        if not file.is_file():
            report.problems.append(f"{file.name}: missing")
            continue
        try:
            shards.append(read_shard(file))
        except CheckpointError as error:
            report.problems.append(str(error))
    return shards


def _check_folder(folder: Path, report: Report) -> list[Shard]:
    index_path = folder / INDEX_NAME
    present = sorted(folder.glob("*.safetensors"))
    if not index_path.is_file():
        if len(present) != 1:
            report.problems.append(f"{len(present)} .safetensors files and no {INDEX_NAME}")
        return _read_shards(present, report)
    try:
        weight_map = load_index(index_path)
    except CheckpointError as error:
        report.problems.append(str(error))
        return _read_shards(present, report)
    listed = sorted({folder / name for name in weight_map.values()})
    shards = _read_shards(listed, report)
    readable = {s.path.name for s in shards}
    subset = {n: f for n, f in weight_map.items() if f in readable}
    report.problems += index_problems(subset, shards)
    unlisted = [p.name for p in present if p not in listed]
    if unlisted:
        report.warnings.append(
            f"files not in the index (ignored by loaders): {', '.join(unlisted)}"
        )
    return shards


def _non_finite(tensor: TensorInfo, pool: SourcePool, buffer: bytearray) -> int:
    """Count NaN and infinite values of a float tensor, reading it in chunks."""
    import torch

    bad, size = 0, itemsize(tensor.dtype)
    step = (_VALUE_CHUNK // size) * size
    for offset in range(0, tensor.nbytes, step):
        view = memoryview(buffer)[: min(step, tensor.nbytes - offset)]
        pool.get(tensor.file).read_into(tensor.start + offset, view)
        values = torch.frombuffer(view, dtype=torch_dtype(tensor.dtype))
        bad += int((~torch.isfinite(values.float())).sum())
    return bad


def _check_values(shards: list[Shard], report: Report, quiet: bool) -> None:
    tensors = [t for s in shards for t in s.tensors if t.is_float and t.nbytes]
    buffer = bytearray(_VALUE_CHUNK)
    bar = byte_progress(sum(t.nbytes for t in tensors), "verify", quiet)
    with SourcePool() as pool, bar:
        for tensor in tensors:
            bad = _non_finite(tensor, pool, buffer)
            if bad:
                report.problems.append(f"{tensor.name!r}: {bad} NaN or infinite values")
            bar.update(tensor.nbytes)


def verify(path: str | Path, *, values: bool = False, quiet: bool = True) -> Report:
    """Check a checkpoint folder or file and report every defect found, not only the first.

    Args:
        path: local checkpoint folder or .safetensors file (resolve Hub ids first).
        values: also read every float tensor and report NaN or infinite values.
        quiet: no progress bar.

    Raises:
        CheckpointError: the path does not exist.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or folder")
    report = Report(path)
    shards = _check_folder(path, report) if path.is_dir() else _read_shards([path], report)
    report.shards, report.tensors = len(shards), sum(len(s.tensors) for s in shards)
    if path.is_dir() and not (path / "config.json").is_file():
        report.warnings.append("no config.json: transformers cannot load this folder as a model")
    if values:
        _check_values(shards, report, quiet)
    return report
