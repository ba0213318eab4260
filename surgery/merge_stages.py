"""Merges in several stages, as `mergekit-multi` runs them: one YAML file of several documents.

A document with a `name:` is an intermediate result, written under the intermediate folder as
that name; the one document without a name is the result written to OUT. A stage refers to
another by giving its name where a model goes (`model:`, `base_model:`...), anywhere in the file;
a name that is no stage is a model path or Hub id. Stages run after the stages they refer to.

An intermediate is reused when it was written by the same stage config from inputs that are
unchanged: its recipe records a fingerprint of both (`fingerprint`), which is stricter than
mergekit's check that a model file exists.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from surgery.core.errors import OutputError
from surgery.engine.ops.merge.spec import MergeConfigError, MergeSpec
from surgery.engine.output_paths import check_output, existing_output
from surgery.engine.reader import SHA256_KEY, Checkpoint

# The recipe key of an intermediate's stage record (its name and fingerprint), and of OUT's
# record of the whole graph.
STAGE_KEY = "stage"
GRAPH_KEY = "stages"
# Keys whose values are never model references (a stage named `linear` is not a method).
_NOT_MODELS = frozenset({"name", "merge_method", "dtype", "out_dtype", "parameters", "filter"})


@dataclass(frozen=True)
class Stage:
    """One document of a multi-stage file.

    Attributes:
        name: the intermediate's name; None for the result written to OUT.
        data: the document without its `name:`, model references as written.
        needs: names of the stages it refers to, in the order they first appear.
    """

    name: str | None
    data: dict
    needs: tuple[str, ...]

    @property
    def label(self) -> str:
        """How messages name the stage."""
        return f"stage {self.name}" if self.name else "the unnamed stage (OUT)"


def _documents(text: str) -> list[object]:
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as error:
        raise MergeConfigError(f"the config is not valid YAML: {error}".splitlines()[0]) from None


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "@" in name:
        raise MergeConfigError(f"stage name {name!r} must be a folder name (no '/', '@')")
    return name


def _model_path(value: str) -> str:
    return value.split("@", 1)[0]


def substitute(value: object, names: dict[str, str], used: list[str] | None = None) -> object:
    """`value` (a document or part of one) with every model reference to a stage replaced by
    the stage's folder (`names`: stage name -> folder), a `@revision` dropped; the names
    met are appended to `used`."""
    if isinstance(value, dict):
        return {k: v if k in _NOT_MODELS else substitute(v, names, used) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, names, used) for v in value]
    if isinstance(value, str) and _model_path(value) in names:
        if used is not None and _model_path(value) not in used:
            used.append(_model_path(value))
        return names[_model_path(value)]
    return value


def _stage(document: object) -> Stage:
    if not isinstance(document, dict):
        raise MergeConfigError("each config document must be a YAML mapping with a merge_method")
    data = dict(document)
    name = _check_name(data.pop("name")) if "name" in data else None
    return Stage(name, data, ())


def _with_needs(stages: list[Stage]) -> list[Stage]:
    names = {s.name: s.name for s in stages if s.name is not None}
    result = []
    for stage in stages:
        used: list[str] = []
        substitute(stage.data, names, used)
        result.append(Stage(stage.name, stage.data, tuple(used)))
    return result


def _in_order(stages: list[Stage]) -> list[Stage]:
    """Every stage after the stages it needs (file order otherwise), the unnamed one last.

    Raises:
        MergeConfigError: a cycle, naming its stages.
    """
    by_name = {s.name: s for s in stages}
    done: dict[str | None, Stage] = {}
    path: list[str | None] = []

    def visit(stage: Stage) -> None:
        if stage.name in done:
            return
        if stage.name in path:
            cycle = [*path[path.index(stage.name) :], stage.name]
            raise MergeConfigError(f"stages form a cycle: {' -> '.join(map(str, cycle))}")
        path.append(stage.name)
        for need in stage.needs:
            visit(by_name[need])
        path.pop()
        done[stage.name] = stage

    for stage in sorted(stages, key=lambda s: s.name is None):
        visit(stage)
    return list(done.values())


def read_stages(text: str) -> list[Stage]:
    """The stages of a config file, in the order they run (the unnamed one, OUT's, last).

    A file of one document without a name is one stage.

    Raises:
        MergeConfigError: bad YAML, a document that is not a mapping, a bad or repeated name,
            no unnamed document or two of them, or a cycle between stages.
    """
    stages = [_stage(doc) for doc in _documents(text)]
    if not stages:
        raise MergeConfigError("the config must be a YAML mapping with a merge_method")
    unnamed = sum(s.name is None for s in stages)
    if unnamed != 1:
        raise MergeConfigError(
            f"the config has {unnamed} documents without a name: exactly one (the result "
            "written to OUT) must have none"
        )
    names = [s.name for s in stages if s.name is not None]
    for name in names:
        if names.count(name) > 1:
            raise MergeConfigError(f"two stages are named {name}")
    return _in_order(_with_needs(stages))


def read_stages_file(path: str | Path) -> list[Stage]:
    """`read_stages` of a file.

    Raises:
        MergeConfigError: the file cannot be read, or see `read_stages`.
    """
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise MergeConfigError(f"cannot read config {path}: {error.strerror}") from None
    return read_stages(text)


def default_intermediate_dir(out: Path) -> Path:
    """The intermediate folder when none is given: `OUT.stages` beside OUT."""
    return out.parent / f"{out.name}.stages"


def _file_identity(path: Path) -> list:
    stat = path.stat()
    return [path.name, stat.st_size, stat.st_mtime_ns]


def input_identity(checkpoint: Checkpoint) -> dict:
    """What identifies an input's content, cheaply: a Hub commit; the shard hashes a surgery
    output records; otherwise each file's name, size and modification time with each shard's
    tensor table (a rewritten or replaced file changes one of them)."""
    if checkpoint.hub is not None:
        return {"repo_id": checkpoint.hub.repo_id, "revision": checkpoint.hub.revision}
    recipe = checkpoint.recipe or {}
    if isinstance(recipe.get(SHA256_KEY), dict):
        return {SHA256_KEY: recipe[SHA256_KEY]}
    folder = checkpoint.folder
    files = sorted(p for p in folder.iterdir() if p.is_file()) if folder else [checkpoint.path]
    tables = [
        [[t.name, t.dtype, list(t.shape), t.start, t.nbytes] for t in shard.tensors]
        for shard in checkpoint.shards
    ]
    return {"files": [_file_identity(p) for p in files], "tensors": tables}


def fingerprint(stage: Stage, options: dict, inputs: Sequence[Checkpoint]) -> str:
    """sha256 of a stage's config (as written), the options that change its bytes and its
    inputs' identities (`input_identity`), in the order the config names them."""
    record = {
        "config": stage.data,
        "options": options,
        "inputs": [input_identity(c) for c in inputs],
    }
    text = json.dumps(record, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def reusable(folder: Path, stage: Stage, digest: str) -> bool:
    """Whether `folder` holds this stage's result from the same config and inputs."""
    record = _stage_record(folder)
    return record is not None and record == {"name": stage.name, "fingerprint": digest}


def ours(folder: Path) -> bool:
    """Whether `folder` is an intermediate a stage wrote (which a rerun may replace)."""
    return _stage_record(folder) is not None


def _stage_record(folder: Path) -> dict | None:
    try:
        recipe = json.loads((folder / "surgery_recipe.json").read_text())
    except (OSError, ValueError):
        return None
    record = recipe.get(STAGE_KEY) if isinstance(recipe, dict) else None
    return record if isinstance(record, dict) else None


def check_stage_outputs(
    stages: Sequence[Stage], specs: Sequence[MergeSpec], out: Path, folder: Path, force: bool
) -> None:
    """Refuse, before any stage runs: OUT or the intermediate folder on, inside or around an
    input of any stage; the one inside the other; OUT existing without `force`; a stage's
    folder that exists and is not an intermediate a stage wrote, without `force`.

    Raises:
        OutputError: with the reason.
    """
    made = {str((folder / s.name).absolute()) for s in stages if s.name}
    inputs = sorted({m for spec in specs for m in spec.models if m not in made})
    local = [Path(m) for m in inputs if Path(m).exists()]
    check_output(out, local, force)
    check_output(folder, local, True)  # it may exist: it holds earlier runs' intermediates
    if out.resolve() == folder.resolve() or out.resolve() in folder.resolve().parents:
        raise OutputError(f"the intermediate folder {folder} is or lies inside OUT {out}")
    if folder.resolve() in out.resolve().parents:
        raise OutputError(f"OUT {out} lies inside the intermediate folder {folder}")
    for stage in stages:
        target = folder / (stage.name or "")
        if stage.name and target.exists() and not ours(target) and not force:
            raise OutputError(existing_output(target))


def stage_record(stage: Stage, digest: str, target: Path, config: dict) -> dict:
    """A stage as OUT's recipe records it: name (None for OUT's), the stages it needs, its
    config as run (`config`: local paths absolute, stages by their folders), its fingerprint
    and where it was written."""
    return {
        "name": stage.name,
        "needs": list(stage.needs),
        "config": config,
        "fingerprint": digest,
        "path": str(target.absolute()),
    }


def remove_intermediates(folder: Path, stages: Sequence[Stage]) -> None:
    """`--clean`: remove the stages' intermediates, then the folder when nothing else is left."""
    for stage in stages:
        if stage.name is not None and ours(folder / stage.name):
            shutil.rmtree(folder / stage.name)
    with contextlib.suppress(OSError):  # it holds something else: it stays
        os.rmdir(folder)
