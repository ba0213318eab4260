"""``lm-eval:TASK[,TASK...]``: lm-evaluation-harness tasks run on the model already in memory.

lm-eval's HFLM accepts an instantiated model, so `surgery sweep` and `surgery localize` can
score every blend on any harness task without writing a checkpoint. lm-eval is an optional
extra (``pip install "checkpoint-surgery[lm-eval]"``); it is imported only when such a task is
loaded. Its metrics come back as ``<name>/<lm-eval task>/<metric>`` (with ``_<filter>`` when
the filter is not ``none``), its per-item samples through ``--log-samples``.

Data is whatever the task config names: a Hub dataset (fetched into the datasets cache; set
HF_DATASETS_OFFLINE=1 to forbid downloads) or local files, e.g. a folder of task YAMLs given as
``include=DIR`` whose configs read ``dataset_path: json`` with local ``data_files``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from eval.errors import TaskSpecError
from eval.kinds.base import ADD_BOS, Kind, Option, Settings, TaskSpec, count, flag, register
from eval.tokens import parse_add_bos

INSTALL = 'pip install "checkpoint-surgery[lm-eval]" (or pip install lm-eval)'


def _import_lm_eval() -> Any:
    try:
        import lm_eval
    except ImportError:
        raise TaskSpecError(f"lm-eval tasks need lm-evaluation-harness: {INSTALL}") from None
    return lm_eval


def task_names(spec: TaskSpec) -> list[str]:
    """The lm-eval task (or group) names of a task string, in order."""
    return [name.strip() for name in str(spec.path).split(",") if name.strip()]


class HarnessTask:
    """lm-eval tasks checked against lm-eval's task index, ready to run on any model."""

    def __init__(self, spec: TaskSpec, names: list[str], manager: Any) -> None:
        self.spec = spec
        self.names = names
        self.manager = manager

    @classmethod
    def from_spec(cls, spec: TaskSpec) -> HarnessTask:
        """Check that lm-eval is installed and knows every task (no data is read yet).

        Raises:
            TaskSpecError: lm-eval missing, an unknown task, or a missing include folder.
        """
        _import_lm_eval()
        from lm_eval.tasks import TaskManager

        include = spec.options["include"]
        if include is not None and not Path(include).is_dir():
            raise TaskSpecError(f"task {spec.text!r}: include={include} is not a folder")
        manager = TaskManager(include_path=include, include_defaults=spec.options["builtin"])
        names = task_names(spec)
        known = set(manager.all_tasks)
        unknown = [name for name in names if name not in known]
        if unknown:
            raise TaskSpecError(
                f"task {spec.text!r}: lm-eval knows no task {unknown[0]!r}"
                + (f" (include={include})" if include else "; add include=DIR for local YAMLs")
            )
        return cls(spec, names, manager)

    def config(self) -> dict[str, Any]:
        """lm-eval's version, the tasks and the options."""
        import lm_eval

        options = self.spec.options
        return {
            "kind": "lm-eval",
            "lm_eval": getattr(lm_eval, "__version__", "unknown"),
            "tasks": self.names,
            "shots": options["shots"],
            "include": options["include"],
            "fewshot_seed": options["fewshot_seed"],
            "add_bos": options["add_bos"],
        }

    def run(self, model: Any, tokenizer: Any, settings: Settings) -> tuple[dict, dict]:
        """Run the tasks with lm-eval's HFLM wrapped around `model`.

        Returns:
            `({<task>/<metric>: value, <task>/n: count}, {versions of the task configs})`.
        """
        import lm_eval
        from lm_eval.models.huggingface import HFLM

        add_bos = parse_add_bos(self.spec.options["add_bos"])
        extra = {} if add_bos is None else {"add_bos_token": add_bos}
        lm = HFLM(
            pretrained=model,
            tokenizer=tokenizer,
            batch_size=settings.batch_size,
            max_length=settings.max_length,
            **extra,
        )
        result = lm_eval.simple_evaluate(
            model=lm,
            tasks=self.names,
            num_fewshot=self.spec.options["shots"],
            limit=settings.limit,
            task_manager=self.manager,
            log_samples=settings.log is not None,
            fewshot_random_seed=self.spec.options["fewshot_seed"],
            random_seed=settings.seed,
            numpy_random_seed=settings.seed,
            torch_random_seed=settings.seed,
        )
        if settings.log is not None:
            for task, samples in result.get("samples", {}).items():
                for sample in samples:
                    settings.log(
                        {"task": self.spec.name, "lm_eval_task": task, **_jsonable(sample)}
                    )
        return flatten_results(result), {"versions": result.get("versions", {})}


def flatten_results(result: dict[str, Any]) -> dict[str, float | int]:
    """lm-eval's results as flat metrics: ``<task>/<metric>[_<filter>]`` and ``<task>/n``.

    Values that are not numbers (lm-eval writes "N/A" for a missing standard error) are left
    out.
    """
    metrics: dict[str, float | int] = {}
    for task, values in result["results"].items():
        for key, value in values.items():
            metric, sep, filt = key.partition(",")
            if not sep or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if isinstance(value, float) and math.isnan(value) and "stderr" not in metric:
                continue
            suffix = "" if filt == "none" else f"_{filt}"
            metrics[f"{task}/{metric}{suffix}"] = value
        samples = result.get("n-samples", {}).get(task)
        if samples:
            metrics[f"{task}/n"] = samples["effective"]
    return metrics


def _jsonable(value: Any) -> Any:
    """lm-eval's sample records (tuples, numpy numbers) as plain JSON values."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


class HarnessKind(Kind):
    """Its argument is a list of lm-eval task names, not a data path."""

    @property
    def reads_path(self) -> bool:
        """lm-eval reads its own data."""
        return False


KIND = register(
    HarnessKind(
        "lm-eval",
        "TASKS",
        "lm-evaluation-harness tasks (comma-separated names, as lm-eval's --tasks) run on the "
        "model in memory; needs the lm-eval extra",
        {
            "shots": Option(count(0), None, "num_fewshot; none: each task's own default"),
            "include": Option(str, None, "folder of extra task YAMLs (local data)"),
            "builtin": Option(
                lambda text: flag(text) != "false", True, "also lm-eval's own tasks: true/false"
            ),
            "fewshot_seed": Option(int, 1234, "lm-eval's fewshot_random_seed"),
            "add_bos": ADD_BOS,
        },
        loader=HarnessTask.from_spec,
    )
)
