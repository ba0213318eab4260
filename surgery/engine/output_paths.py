"""Where a command may write: one rule for every output, a checkpoint folder or a single file.

- Never onto, inside, or around an input (inputs are never modified), whatever the flags.
- Never over a weights file (`*.safetensors`, `*.bin`...), whatever the flags: a result file
  written over a shard destroys a model, and nothing on the command line asks for that.
- Over an existing output, or inside a folder that holds weights (a checkpoint, a training or
  surgery output), only with `--force`; the refusal says what the folder is, so the `--force`
  hint never invites replacing a training run unknowingly.

Every check runs before any work, so a refused command writes nothing.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from pathlib import Path

from surgery.core.errors import OutputError

# The records that name what made a checkpoint folder (train/checkpoint_io.py and
# surgery/engine/writer.py write them; the engine cannot import train).
TRAIN_RECORD = "surgery_train.json"
RECIPE_RECORD = "surgery_recipe.json"
# Files a weights file may be called; a result file never replaces one.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack")
# Names that make a folder a checkpoint: Hugging Face's weights and index names. A stray
# `base.safetensors` in a working folder does not (single-file inputs live in such folders).
_CHECKPOINT_NAMES = (
    "*.safetensors.index.json",
    "model*.safetensors",
    "adapter_model*.safetensors",
    "consolidated*.safetensors",
    "pytorch_model*.bin",
    TRAIN_RECORD,
    RECIPE_RECORD,
)


def _is_within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def checkpoint_kind(folder: Path) -> str | None:
    """What `folder` holds, in words, when it is a checkpoint; None when it is not one.

    Returns:
        "a training output (surgery_train.json)", "a surgery output (surgery_recipe.json)",
        "a checkpoint (it holds weights)", or None (not a folder, or no weights in it).
    """
    try:
        names = [entry.name for entry in os.scandir(folder)]
    except OSError:
        return None
    if not any(fnmatch.fnmatch(name, pattern) for name in names for pattern in _CHECKPOINT_NAMES):
        return None
    if TRAIN_RECORD in names:
        return f"a training output ({TRAIN_RECORD})"
    if RECIPE_RECORD in names:
        return f"a surgery output ({RECIPE_RECORD})"
    return "a checkpoint (it holds weights)"


def _enclosing_checkpoint(target: Path, inputs: Sequence[Path]) -> tuple[Path, str] | None:
    """The input folder `target` (resolved) lies in, or else its own folder when that holds
    weights. Only the nearest folder is looked at for weights: a home folder that happens to
    hold a `model.safetensors` must not make every path below it a checkpoint's."""
    for source in inputs:
        if source in target.parents:
            return source, checkpoint_kind(source) or "an input of this command"
    kind = checkpoint_kind(target.parent)
    return (target.parent, kind) if kind is not None else None


def _checkpoints_in(folder: Path, shown: int = 3) -> list[str]:
    """Names of the first `shown` subfolders of `folder` that are checkpoints ("..." if more)."""
    try:
        subfolders = sorted(entry.path for entry in os.scandir(folder) if entry.is_dir())
    except OSError:
        return []
    held = [Path(path).name for path in subfolders if checkpoint_kind(Path(path))]
    return held[:shown] + (["..."] if len(held) > shown else [])


def existing_output(out: Path, alternatives: str = "") -> str:
    """The refusal for an existing output folder `out`, naming what it is when it holds weights
    (TRAINED and OUT swapped must not read as an invitation to --force).

    Args:
        alternatives: more ways out, said after --force (e.g. "or --resume to continue...").
    """
    kind = checkpoint_kind(out)
    if kind is None:
        held = _checkpoints_in(out)
        if not held:
            return f"output {out} already exists; pass --force to replace it{alternatives}"
        return (
            f"output {out} already exists and holds checkpoints ({', '.join(held)}); "
            f"--force would replace it with all of them{alternatives}"
        )
    return (
        f"output {out} already exists and is {kind}: check the order of the arguments; "
        f"--force would replace it and lose what it holds{alternatives}"
    )


def check_output(out: Path, inputs: Sequence[Path], force: bool) -> None:
    """Refuse an output folder OUT that is, lies inside, or contains an input; one that exists,
    or lies inside a folder holding weights, unless forced.

    Raises:
        OutputError: with the reason (and what an existing OUT is, when it holds weights).
    """
    target = out.resolve()
    sources = [Path(given).resolve() for given in inputs]
    for given, source in zip(inputs, sources, strict=True):
        if _is_within(target, source):
            raise OutputError(f"output {out} is or lies inside the input {given}; choose another")
        if _is_within(source, target):
            raise OutputError(f"output {out} contains the input {given}; choose another")
    _refuse_weights_file(out, target)
    if force:
        return
    if target.exists():
        raise OutputError(existing_output(out))
    _refuse_inside_checkpoint(out, target, sources)


def _refuse_weights_file(out: Path, target: Path) -> None:
    """Never replace a weights file, whatever the flags (nothing asks for a shard to go)."""
    if target.suffix.lower() in WEIGHT_SUFFIXES and target.is_file():
        raise OutputError(f"output {out} is a weights file; choose another path")


def _refuse_inside_checkpoint(out: Path, target: Path, sources: Sequence[Path]) -> None:
    enclosing = _enclosing_checkpoint(target, sources)
    if enclosing is not None:
        folder, kind = enclosing
        raise OutputError(
            f"output {out} lies inside {folder}, {kind}; choose another path, or pass --force "
            "to write there"
        )


def check_output_file(path: Path, inputs: Sequence[Path] = (), force: bool = False) -> None:
    """Refuse a result file (JSON, CSV, plot...) `path` that would destroy data: onto an input or
    a weights file (always), over an existing file or inside a folder holding weights (unless
    forced), or onto a folder.

    Args:
        path: the file the command will write.
        inputs: the command's local inputs (folders or single-file checkpoints).
        force: the command's --force.

    Raises:
        OutputError: with the reason.
    """
    target = Path(path).resolve()
    sources = [Path(given).resolve() for given in inputs]
    if target.is_dir():
        raise OutputError(f"output {path} is a folder; give a file name")
    if any(target == source for source in sources):
        raise OutputError(f"output {path} is an input of this command; choose another path")
    _refuse_weights_file(path, target)
    if force:
        return
    if target.exists():
        raise OutputError(f"output {path} already exists; pass --force to replace it")
    _refuse_inside_checkpoint(Path(path), target, sources)


def check_output_files(
    paths: Sequence[Path | str | None], inputs: Sequence[Path | str] = (), force: bool = False
) -> None:
    """`check_output_file` for each result file a command was given (None: not asked for), and
    no two of them the same file.

    Raises:
        OutputError: with the reason.
    """
    given = [Path(path) for path in paths if path is not None]
    sources = [Path(source) for source in inputs]
    for path in given:
        check_output_file(path, sources, force)
    seen: dict[Path, Path] = {}
    for path in given:
        first = seen.setdefault(path.resolve(), path)
        if first is not path:
            raise OutputError(f"outputs {first} and {path} are the same file; give two names")


def check_resumable_folder(out: Path) -> None:
    """Refuse a folder that a resumable command (`surgery demo`) would fill, continuing what it
    holds: not a file, not a folder holding weights, not inside one.

    Raises:
        OutputError: with the reason.
    """
    target = Path(out).resolve()
    if target.exists() and not target.is_dir():
        raise OutputError(f"output {out} exists and is not a folder; choose another")
    kind = checkpoint_kind(target)
    if kind is not None:
        raise OutputError(f"output {out} is {kind}; choose another folder")
    enclosing = _enclosing_checkpoint(target, ())
    if enclosing is not None:
        folder, kind = enclosing
        raise OutputError(f"output {out} lies inside {folder}, {kind}; choose another")
