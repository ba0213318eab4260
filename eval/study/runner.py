"""`surgery eval MODEL --suite SUITE.yml -o DIR`: every unit of a suite on one model load.

Order of work: the suite is parsed and every unit's data is found and read (a missing file is an
error naming it, or with ``allow_missing`` a unit skipped and listed in results.json), a results
folder left by an earlier run is checked to belong to the same model, suite and settings, and
only then does the model load. Units already in DIR/results.json are kept; each remaining unit is
scored through `eval.api.evaluate`, its samples file written, then results.json rewritten. Every
write is atomic, and nothing in the files depends on when or in how many runs they were made, so
an interrupted run, rerun, ends with the bytes of an uninterrupted one.

Under ``torchrun`` (WORLD_SIZE > 1) each rank loads its own copy of the model and scores every
WORLD_SIZE-th remaining unit; the ranks exchange their units' metrics and samples after each
round and rank 0 alone writes DIR, the same files one process writes.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from eval.errors import EvalDataError, MissingDataError, SuiteError
from eval.options import DEFAULT_BATCH_SIZE
from eval.study import results as res
from eval.study.halves import half_of
from eval.study.suite import Unit, load_suite, plan
from eval.study.tokenizer_id import SETTING, tokenizer_folder, tokenizer_sha256
from eval.tasks import KINDS, Task


@dataclass(frozen=True)
class SuiteRun:
    """What `run_suite` needs besides the model: the eval settings as `surgery eval` takes them."""

    device: str = "cpu"
    dtype: str | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    limit: int | None = None
    seed: int = 0
    max_length: int | None = None
    fewshot_seeds: tuple[int, ...] = ()
    allow_missing: bool = False
    tokenizer: str | None = None
    progress: bool = True
    # Called with one line per unit that allow_missing skips (the CLI prints it as a warning).
    warn: Callable[[str], None] | None = None
    half: str | None = None  # search or report: one half of the items (`eval.study.halves`)
    split_seed: int = 0  # the seed that split them

    def settings(self, tokenizer_digest: str | None = None) -> dict[str, Any]:
        """results.json's ``settings``: what changes scores (a resumed run must match them),
        with the sha256 of the tokenizer's files (`eval.study.tokenizer_id`), the kind of
        device and the dtype the model loads in (the default resolved: never None); the half
        and its split seed only when one half is scored.

        Raises:
            ModelError: a bad device or dtype.
        """
        from eval.model_loading import device_type, dtype_name

        halves = {"half": self.half, "split_seed": self.split_seed} if self.half else {}
        return {
            "seed": self.seed,
            "limit": self.limit,
            "batch_size": self.batch_size,
            "max_length": self.max_length,
            res.DEVICE: device_type(self.device),
            res.DTYPE: dtype_name(self.dtype, self.device),
            "fewshot_seeds": list(self.fewshot_seeds) or [None],
            SETTING: tokenizer_digest,
            **halves,
        }

    def items(self, unit: Unit, task: Task) -> frozenset[int] | None:
        """The items of `unit` this run scores: its half, or None for all of them.

        Raises:
            TaskSpecError: the unit's task cannot be split into halves.
        """
        if self.half is None:
            return None
        return half_of(task, unit.id, self.half, self.split_seed, self.limit, self.seed)


def missing_path(unit: Unit) -> str | None:
    """The data path a unit needs that does not exist, or None when all of it is there."""
    return KINDS[unit.kind].missing(unit.spec)


def data_files(task: Task) -> list[Path]:
    """The files a loaded task read, sorted (none for copain and lm-eval)."""
    files = getattr(task, "files", None)
    if files is not None:  # flores: the two languages' files
        return sorted(files)
    path = task.spec.path
    if path is None or not KINDS[task.spec.kind].reads_path:
        return []
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file())


def data_ref(task: Task) -> res.DataRef | None:
    """The unit's data path and a sha256 over its files (names relative to the path, bytes)."""
    files = data_files(task)
    source = getattr(task, "source", None)  # a Hub dataset: its files in the cache's snapshot
    if source is not None and not files:  # a streamed prefix: the documents read
        return res.DataRef(
            str(task.spec.dataset), task.rows_sha256, source.dataset, None, None, source.commit
        )
    if not files:
        return None
    root = source.folder if source is not None else task.spec.path
    digest = hashlib.sha256()
    for file in files:
        name = file.name if root is None or root.is_file() else str(file.relative_to(root))
        digest.update(f"{name}\0{hashlib.sha256(file.read_bytes()).hexdigest()}\n".encode())
    if source is None:
        return res.DataRef(str(root), digest.hexdigest())
    return res.DataRef(
        str(task.spec.dataset),
        digest.hexdigest(),
        source.dataset,
        source.config,
        source.split,
        source.commit,
    )


def unit_metrics(unit: Unit, metrics: dict[str, Any]) -> dict[str, Any]:
    """`evaluate`'s metrics of one unit without the ``<task>/`` (and ppl's ``<lang>/``) prefix."""
    prefix = KINDS[unit.kind].metric_prefix(unit.task, unit.lang)
    return {key.removeprefix(prefix): value for key, value in metrics.items()}


def prepare(
    suite_path: Path, options: SuiteRun, wanted: Callable[[Unit], bool] | None = None
) -> tuple[dict[str, Any], list[Unit], list[res.MissingUnit], dict[str, Task]]:
    """Parse the suite, plan its units, find missing data and read the rest (no model).

    A unit's data is missing when its local path does not exist, or when its Hub dataset has
    no such config or file (`MissingDataError`); with ``allow_missing`` such a unit is skipped,
    listed in results.json and named in one line to `options.warn`.

    Args:
        wanted: keep only the units it accepts (None: all); the others' data is never read.

    Returns:
        `(normalized suite, units to score, missing units, unit id -> loaded task)`.

    Raises:
        SuiteError: a bad suite.
        EvalDataError: missing data (without ``allow_missing``) or a malformed file.
    """
    from eval.tasks import load_task

    suite = load_suite(suite_path)
    units, missing, tasks = [], [], {}
    for unit in plan(suite, options.fewshot_seeds or None):
        if wanted is not None and not wanted(unit):
            continue
        where = f"suite {suite_path}: task {unit.task}, {unit.lang or 'no language'}"
        absent = missing_path(unit)
        reason = f"no such file or folder {absent}"
        if absent is None:
            try:
                tasks[unit.id] = load_task(unit.spec)
            except MissingDataError as error:
                absent, reason = str(unit.spec.dataset or unit.spec.path), str(error)
            else:
                units.append(unit)
                continue
        if not options.allow_missing:
            raise EvalDataError(f"{where}: {reason} (--allow-missing skips it)")
        entry = res.MissingUnit(unit.task, unit.lang, absent)
        if entry not in missing:  # one entry for every few-shot seed of the unit
            missing.append(entry)
            if options.warn is not None:
                name = "/".join(part for part in (unit.task, unit.lang) if part)
                options.warn(f"skipped {name}: {reason}")
    for unit in units:  # a unit that cannot be halved fails now, before any model loads
        options.items(unit, tasks[unit.id])
    return suite.normalized(), units, missing, tasks


def model_info(checkpoint: str, model: Any | None = None) -> res.ModelInfo:
    """The model as results.json names it; the Hub revision when transformers recorded one."""
    path = Path(checkpoint)
    name = path.resolve().name if path.exists() else checkpoint
    revision = getattr(getattr(model, "config", None), "_commit_hash", None)
    return res.ModelInfo(checkpoint, name, None if path.exists() else revision)


def check_resumable(directory: Path, expected: res.SuiteResults) -> res.SuiteResults | None:
    """The results already in DIR if they were made by the same model, suite and settings.

    A folder written before the dtype was recorded is of an unknown dtype: refused, as scores
    in two dtypes would be mixed in one folder.

    Raises:
        SuiteError: DIR holds results of another model, suite or settings (named in one line).
    """
    if not (directory / res.RESULTS_FILE).exists():
        return None
    found = res.read_results(directory)
    for label, old, new in (
        ("model", found.model.path, expected.model.path),
        ("suite", found.suite_sha256, expected.suite_sha256),
        # Before the other settings, so that the line names them rather than printing them all.
        (
            "tokenizer",
            f"{SETTING} {found.settings.get(SETTING) or 'not recorded'}",
            f"{SETTING} {expected.settings.get(SETTING) or 'not recorded'}",
        ),
        ("dtype", f"{res.DTYPE} {found.dtype}", f"{res.DTYPE} {expected.dtype}"),
        ("device", f"{res.DEVICE} {found.device}", f"{res.DEVICE} {expected.device}"),
        ("settings", found.settings, expected.settings),
    ):
        if old != new:
            raise SuiteError(
                f"{directory} holds results of another {label} ({old} there, {new} now); "
                "give another -o DIR"
            )
    return found


def run_suite(checkpoint: str, suite_path: Path, directory: Path, options: SuiteRun) -> Path | None:
    """Score `checkpoint` on every unit of a suite and write DIR (see the module docstring).

    Args:
        checkpoint: model folder or Hub id.
        suite_path: the suite YAML.
        directory: results folder; an earlier run's folder is continued.
        options: eval settings, few-shot seeds, allow_missing.

    Returns:
        DIR/results.json (None on ranks other than 0, which write nothing).

    Raises:
        SuiteError, EvalDataError, TaskSpecError: before the model loads.
        ModelError, CheckpointError: the model cannot be loaded.
    """
    suite, units, missing, tasks = prepare(suite_path, options)
    tokenizer = tokenizer_sha256(tokenizer_folder(checkpoint, options.tokenizer))
    header = res.SuiteResults(
        model=model_info(checkpoint),
        suite=suite,
        suite_sha256=res.suite_sha256(suite),
        settings=options.settings(tokenizer),
        units=(),
        missing=tuple(missing),
        complete=False,
    )
    rank, world = _rank_and_world()
    found = check_resumable(directory, header)
    if found is not None:  # its revision, known once the model had loaded
        header = replace(header, model=found.model, threads=found.threads)
    folder = _Folder(directory, header, units, rank == 0)
    for unit in found.units if found else ():
        if (directory / unit.samples).is_file():
            folder.done[unit.id] = unit
    todo = [unit for unit in units if unit.id not in folder.done]
    if todo:
        from eval.model_loading import load_model

        model, tok = load_model(
            checkpoint,
            _rank_device(options.device, world),
            options.dtype,
            tokenizer=options.tokenizer,
            progress=options.progress and rank == 0,
        )
        threads = sys.modules["torch"].get_num_threads()  # loaded with the model
        folder.header = replace(header, model=model_info(checkpoint, model), threads=threads)
        _score_remaining(model, tok, todo, tasks, folder, options, rank, world)
    _finish_group(world)
    folder.save(complete=True)
    return directory / res.RESULTS_FILE if folder.writes else None


@dataclass
class _Folder:
    """DIR as this run fills it: the units finished so far, in plan order; only rank 0 writes."""

    directory: Path
    header: res.SuiteResults
    units: list[Unit]
    writes: bool
    done: dict[str, res.UnitResult] = field(default_factory=dict)

    def add(self, result: res.UnitResult, samples: list[dict[str, Any]]) -> None:
        """A finished unit: its samples file first, so results.json never names a missing one."""
        if self.writes:
            res.write_samples(self.directory, result.id, samples)
        self.done[result.id] = result

    def save(self, complete: bool = False) -> None:
        """Rewrite results.json: the finished units in plan order, however many runs made them."""
        if self.writes:
            finished = tuple(self.done[u.id] for u in self.units if u.id in self.done)
            results = replace(self.header, units=finished, complete=complete)
            res.write_results(self.directory, results)


def _score_remaining(
    model: Any,
    tok: Any,
    todo: list[Unit],
    tasks: dict[str, Task],
    folder: _Folder,
    options: SuiteRun,
    rank: int,
    world: int,
) -> None:
    """Score the units not yet done, `world` at a time (one per rank), saving after each round."""
    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), unit="unit", disable=not options.progress or rank > 0)
    for start in range(0, len(todo), world):
        batch = todo[start : start + world]
        bar.set_postfix_str(batch[0].id)
        mine = batch[rank] if rank < len(batch) else None
        scored = score_unit(model, tok, mine, tasks[mine.id], options) if mine else None
        for result, samples in _gather(scored, world):
            folder.add(result, samples)
        folder.save()
        bar.update(len(batch))
    bar.close()


def score_unit(
    model: Any, tok: Any, unit: Unit, task: Task, options: SuiteRun
) -> tuple[res.UnitResult, list[dict[str, Any]]]:
    """Score one unit on a model in memory (its half of the items when `options` names one):
    its results.json entry and its samples lines."""
    from eval.api import evaluate

    records: list[dict[str, Any]] = []
    result = evaluate(
        model,
        tok,
        [task],
        batch_size=options.batch_size,
        limit=options.limit,
        seed=options.seed if unit.fewshot_seed is None else unit.fewshot_seed,
        max_length=options.max_length,
        progress=False,
        log_samples=records.append,
        items=options.items(unit, task),
    )
    scored = res.UnitResult(
        id=unit.id,
        task=unit.task,
        kind=unit.kind,
        variant=unit.variant,
        lang=unit.lang,
        family=unit.family,
        split=unit.split,
        fewshot_seed=unit.fewshot_seed,
        metrics=unit_metrics(unit, result["metrics"]),
        samples=res.samples_name(unit.id),
        data=data_ref(task),
    )
    return scored, records


def _gather(scored: Any, world: int) -> list[Any]:
    """Every rank's scored unit (None where a rank had none this round), in rank order."""
    if world == 1:
        return [scored] if scored is not None else []
    import torch.distributed as dist

    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, scored)
    return [item for item in gathered if item is not None]


def _rank_and_world() -> tuple[int, int]:
    """This process's rank and the world size; starts the process group under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def _finish_group(world: int) -> None:
    """Wait for every rank, then leave the process group (started by `_rank_and_world`)."""
    if world == 1:
        return
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def _rank_device(device: str, world: int) -> str:
    """Under torchrun, plain ``cuda`` means this rank's GPU (LOCAL_RANK), one model per GPU."""
    if world > 1 and device == "cuda":
        return f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    return device
