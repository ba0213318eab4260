"""verify: check every shard header, the index, the recorded sha256 of every shard (and the Hub's,
for a Hub cache snapshot), the recipe, and optionally every value of a checkpoint."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from surgery.core.dtypes import itemsize, torch_dtype
from surgery.core.errors import CheckpointError
from surgery.engine.progress import byte_progress
from surgery.engine.reader import (
    INDEX_NAME,
    RECIPE_NAME,
    SHA256_KEY,
    THREADS_KEY,
    Shard,
    TensorInfo,
    index_problems,
    load_index,
    member,
    open_regular,
    read_shard,
)
from surgery.engine.recipe import public_recipe
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


def _root(folder: Path) -> Path:
    """Where the folder's files may live: the repository's cache folder for a Hub snapshot
    (`models--org--name/snapshots/<sha>`, whose files link into its `blobs/`), else itself."""
    repo = folder.parent.parent
    if folder.parent.name == "snapshots" and repo.name.startswith("models--"):
        return repo
    return folder


def _check_folder(folder: Path, report: Report) -> list[Shard]:
    index_path = folder / INDEX_NAME
    present = sorted(folder.glob("*.safetensors"))
    if not index_path.is_file():
        if len(present) != 1:
            report.problems.append(f"{len(present)} .safetensors files and no {INDEX_NAME}")
        return _read_shards(present, report)
    try:
        weight_map = load_index(index_path)
        root = _root(folder)
        listed = sorted({member(folder, name, root) for name in weight_map.values()})
    except CheckpointError as error:
        report.problems.append(str(error))
        return _read_shards(present, report)
    if not weight_map:
        report.problems.append(f"{INDEX_NAME}: the weight_map is empty (it maps no tensor)")
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


_HUB_BLOB = re.compile(r"^[0-9a-f]{64}$")


def _recorded_hashes(folder: Path, report: Report) -> dict[str, str]:
    """The shard sha256s an output of this tool recorded (recipe and index must agree)."""
    records = []
    for name, key in ((RECIPE_NAME, None), (INDEX_NAME, "metadata")):
        try:
            data = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        data = data.get(key) if key and isinstance(data, dict) else data
        if isinstance(data, dict) and isinstance(data.get(SHA256_KEY), dict):
            records.append((name, data[SHA256_KEY]))
    if len(records) == 2 and records[0][1] != records[1][1]:
        report.problems.append(f"{RECIPE_NAME} and {INDEX_NAME} record different shard hashes")
    return records[0][1] if records else {}


def _hub_hash(file: Path) -> str | None:
    """The sha256 the Hub reported for a file of a Hub cache snapshot (its blob's name)."""
    target = file.resolve()
    if file.is_symlink() and target.parent.name == "blobs" and _HUB_BLOB.match(target.name):
        return target.name
    return None


def _sha256(file: Path, bar) -> str:
    digest = hashlib.sha256()
    with open(open_regular(file), "rb") as handle:
        while chunk := handle.read(_VALUE_CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def _check_hashes(path: Path, shards: list[Shard], report: Report, quiet: bool) -> None:
    """Compare each shard's sha256 with what the output recorded and what the Hub reported."""
    recorded = _recorded_hashes(path, report) if path.is_dir() else {}
    expected = {s.path: (recorded.get(s.path.name), _hub_hash(s.path)) for s in shards}
    if recorded:
        unrecorded = sorted(s.path.name for s in shards if s.path.name not in recorded)
        if unrecorded:
            report.problems.append(f"no recorded sha256 for {', '.join(unrecorded)}")
    todo = [s for s in shards if any(expected[s.path])]
    bar = byte_progress(sum(s.size for s in todo), "sha256", quiet)
    with bar:
        for shard in todo:
            actual = _sha256(shard.path, bar)
            mine, hubs = expected[shard.path]
            if mine and actual != mine:
                report.problems.append(
                    f"{shard.path.name}: sha256 {actual[:12]}... differs from the recorded "
                    f"{mine[:12]}... (changed or swapped after it was written)"
                )
            if hubs and actual != hubs:
                report.problems.append(
                    f"{shard.path.name}: sha256 {actual[:12]}... differs from the Hub's "
                    f"{hubs[:12]}... (corrupt download or modified cache)"
                )


def _unthreaded(text: str) -> dict:
    """A recipe as JSON text, without the threads that made it (a training record has them)."""
    recipe = json.loads(text)
    recipe.pop(THREADS_KEY, None)
    return recipe


def _check_recipe(folder: Path, shards: list[Shard], report: Report) -> None:
    """surgery_recipe.json must say what the shards' own metadata says (hashes and threads
    aside): the shards embed its public copy (older outputs: the same recipe)."""
    embedded = [s.metadata.get("surgery_recipe") for s in shards]
    if not (folder / RECIPE_NAME).is_file() or not any(embedded):
        return
    try:
        recipe = json.loads((folder / RECIPE_NAME).read_text())
        recipe.pop(SHA256_KEY, None)
        recipe.pop(THREADS_KEY, None)
        accepted = (recipe, public_recipe(recipe))
        mismatch = any(text is None or _unthreaded(text) not in accepted for text in embedded)
    except (OSError, ValueError, AttributeError):
        mismatch = True
    if mismatch:
        report.problems.append(f"{RECIPE_NAME} differs from the recipe in the shards (edited?)")


def verify(path: str | Path, *, values: bool = False, quiet: bool = True) -> Report:
    """Check a checkpoint folder or file and report every defect found, not only the first.

    Headers and index; each shard's sha256 against the one this tool recorded when it wrote the
    shard and, for a Hub cache snapshot, the one the Hub reported (its blob's name); the recipe
    file against the recipe inside the shards.

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
    if path.is_dir():
        _check_recipe(path, shards, report)
    _check_hashes(path, shards, report, quiet)
    if values:
        _check_values(shards, report, quiet)
    return report
