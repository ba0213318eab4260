"""A suite's units scored on a model in memory, and averaged as `compare` averages them.

`surgery sweep --suite`, `surgery localize --suite` and `surgery search` set a model's weights
to a blend in memory (`surgery.diagnostics.memory_blend`) and score it here: every unit of the
suite (or of some of its tasks and languages; one half of their items), through the suite
runner's `score_unit`, with the prefix cache of multiple-choice prompts as `surgery eval`
uses it. The per-item lines stay in memory as a `compare` run; `compare_runs` turns them into
values per language, family, split (held in, held out, the suite's `others`) and overall, the
numbers `surgery compare` prints for the same items. Nothing is written unless asked
(`write_run`: a results folder `surgery compare` reads).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from eval.options import ScoringOptions
from eval.study import results as res
from eval.study.compare import Comparison, Run, compare_runs
from eval.study.runner import SuiteRun, prepare, score_unit
from eval.study.suite import Unit
from eval.study.tokenizer_id import tokenizer_folder, tokenizer_sha256
from eval.tasks import Task


@dataclass(frozen=True)
class PreparedSuite:
    """A suite's units with their data read (and their halves checked), ready to score any model.

    Attributes:
        suite: the normalized suite (results.json's ``suite``).
        units: the units scored, in plan order.
        tasks: unit id -> loaded task.
        options: the eval settings.
        settings: results.json's ``settings`` (with the tokenizer's sha256).
    """

    suite: dict[str, Any]
    units: list[Unit]
    tasks: dict[str, Task]
    options: SuiteRun
    settings: dict[str, Any]


def prepare_suite(
    suite_path: Path,
    options: SuiteRun,
    tokenizer_of: str | Path,
    wanted: Callable[[Unit], bool] | None = None,
) -> PreparedSuite:
    """Read the suite, its units' data and their halves, before any model loads.

    Args:
        suite_path: the suite YAML.
        options: eval settings (``half`` and ``split_seed`` choose the items).
        tokenizer_of: the checkpoint whose tokenizer scores (recorded by its sha256).
        wanted: only the units it accepts (None: all).

    Raises:
        SuiteError, EvalDataError, TaskSpecError: a bad suite, missing or bad data, a unit
            that cannot be halved; SuiteError also when no unit is left.
    """
    from eval.errors import SuiteError

    suite, units, missing, tasks = prepare(suite_path, options, wanted)
    if missing or not units:
        raise SuiteError(f"suite {suite_path}: no unit to score")
    digest = tokenizer_sha256(tokenizer_folder(str(tokenizer_of), options.tokenizer))
    return PreparedSuite(suite, units, tasks, options, options.settings(digest))


def score_suite(
    model: Any, tokenizer: Any, prepared: PreparedSuite, name: str, progress: bool = False
) -> Run:
    """Score every unit of `prepared` on the model as it is now; a `compare` run named `name`
    holding its lines in memory."""
    from tqdm.auto import tqdm

    units, samples = [], {}
    for unit in tqdm(prepared.units, unit="unit", disable=not progress, leave=False):
        task = prepared.tasks[unit.id]
        result, lines = score_unit(model, tokenizer, unit, task, prepared.options)
        units.append(result)
        samples[unit.id] = lines
    results = res.SuiteResults(
        model=res.ModelInfo(name, name),
        suite=prepared.suite,
        suite_sha256=res.suite_sha256(prepared.suite),
        settings=prepared.settings,
        units=tuple(units),
        missing=(),
        complete=True,
        threads=sys.modules["torch"].get_num_threads(),  # the model ran: torch is loaded
    )
    return Run(Path(name), results, name, samples)


def write_run(run: Run, directory: Path, model: res.ModelInfo | None = None) -> Path:
    """Write an in-memory run as a results folder (results.json and samples), as `surgery eval
    --suite` would: `surgery compare` reads it."""
    assert run.samples is not None
    for unit in run.results.units:
        res.write_samples(directory, unit.id, run.samples[unit.id])
    results = run.results if model is None else replace(run.results, model=model)
    res.write_results(directory, results)
    return directory


def axis_name(row: dict[str, Any]) -> str:
    """A comparison row's (or axis's) task as measures name it: `ppl`, or
    `flores[eng_Latn-{lang}]` for one direction (variant) of a task."""
    return row["task"] if row["variant"] is None else f"{row['task']}[{row['variant']}]"


def summary(comparison: Comparison, model: str) -> dict[tuple[str, str, str | None], float]:
    """`model`'s values over a split or a whole task: (task, metric, split) -> value, where
    split is held_in, held_out or others (the mean over families, or over the `others`
    languages) and None for a task without languages (Copain)."""
    values = {}
    for row in comparison.rows:
        if row["model"] != model or row["scope"] not in ("overall", "task"):
            continue
        values[(axis_name(row), row["metric"], row["split"])] = row["value"]
    return values


def primary_metrics(comparison: Comparison) -> set[tuple[str, str]]:
    """(task, metric) of each task's primary metric (ppl, chrF, the first accuracy)."""
    return {(axis_name(axis), axis["metric"]) for axis in comparison.axes if axis["primary"]}


class SuiteScorer:
    """A suite as the scorer `surgery sweep` and `surgery localize` receive
    (`surgery.diagnostics.scoring.Scorer`): each model's primary metric of every task, over
    held-in, held-out and `others` languages, named `<task>/<split>/<metric>`
    (`ppl/held_in/ppl`; `copain/acc` for a task without languages).
    """

    @classmethod
    def of(
        cls, suite_path: str | Path, options: ScoringOptions, tokenizer_of: str | Path
    ) -> SuiteScorer:
        """The suite's units read and halved now, before any model loads.

        Args:
            options: how the models are scored (its half and split seed included).
            tokenizer_of: the checkpoint whose tokenizer scores (TRAINED).
        """
        from eval.study.scoring import suite_run

        settings = suite_run(options.resolved(), progress=False)
        return cls(prepare_suite(Path(suite_path), settings, tokenizer_of))

    def __init__(self, prepared: PreparedSuite) -> None:
        self.prepared = prepared
        from eval.model_loading import dtype_name

        options = prepared.options
        self.config = {
            "device": options.device,
            "dtype": dtype_name(options.dtype, options.device),  # resolved, as results.json
            "batch_size": options.batch_size,
            "limit": options.limit,
            "seed": options.seed,
            "max_length": options.max_length,
            "suite": prepared.suite,
            **({"half": options.half, "split_seed": options.split_seed} if options.half else {}),
        }

    def load(self, folder: Path) -> tuple[Any, Any]:
        """The model and tokenizer in `folder` on the settings' device and dtype."""
        from eval.model_loading import load_model

        options = self.prepared.options
        return load_model(
            folder, options.device, options.dtype, tokenizer=options.tokenizer, progress=False
        )

    def __call__(self, model: Any, tokenizer: Any, *, progress: bool = False) -> dict[str, Any]:
        """The suite's averaged primary metrics on this model."""
        run = score_suite(model, tokenizer, self.prepared, "model", progress)
        comparison = compare_runs([run], resamples=1)
        primary = primary_metrics(comparison)
        return {
            "/".join(part for part in (task, split, metric) if part): value
            for (task, metric, split), value in summary(comparison, "model").items()
            if (task, metric) in primary
        }
