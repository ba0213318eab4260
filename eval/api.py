"""The eval wrapper's Python API: score a model already in memory on a list of tasks.

    from eval.api import evaluate, load_model

    model, tokenizer = load_model("out/reverted", device="cuda")
    result = evaluate(model, tokenizer, ["belebele:data/eng_Latn.jsonl", "copain"], limit=100)
    result["metrics"]["belebele/acc"]

Other commands (an interpolation sweep, layer localization) call `evaluate` on weights they
hold, so no checkpoint has to be written between two scores.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Callable, Collection, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from eval.errors import TaskSpecError
from eval.model_loading import load_model, model_context, model_device
from eval.options import DEFAULT_BATCH_SIZE, ScoringOptions
from eval.tasks import Settings, Task, TaskSpec, check_unique_names, load_task, parse_task

__all__ = ["evaluate", "load_model", "load_task", "load_tasks", "score_checkpoint"]

# Used when neither --max-length nor the model's config says how long a sequence may be.
FALLBACK_MAX_LENGTH = 2048


def load_tasks(tasks: Sequence[str | TaskSpec | Task]) -> list[Task]:
    """Parse task strings and read their data, without a model (so bad data fails fast).

    Args:
        tasks: task strings (see `eval.tasks`), parsed specs, or tasks already loaded.

    Returns:
        Loaded tasks, in order.

    Raises:
        TaskSpecError: no task, a string that does not parse, or two tasks with one name.
        EvalDataError: a data file is missing or malformed.
    """
    if not tasks:
        raise TaskSpecError("no task given; pass at least one, e.g. copain")
    specs = [parse_task(t) if isinstance(t, str) else t for t in tasks]
    check_unique_names([s if isinstance(s, TaskSpec) else s.spec for s in specs])
    return [load_task(s) if isinstance(s, TaskSpec) else s for s in specs]


def evaluate(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[str | TaskSpec | Task],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    limit: int | None = None,
    seed: int = 0,
    max_length: int | None = None,
    progress: bool = True,
    log_samples: str | Path | Callable[[dict[str, Any]], None] | None = None,
    prefix_cache: bool = True,
    items: Collection[int] | None = None,
) -> dict[str, Any]:
    """Score a model on tasks.

    Args:
        model: a causal LM (any device or dtype); put in eval mode while scoring, then restored.
        tokenizer: its tokenizer.
        tasks: task strings such as ``"piqa:data/piqa.jsonl:shots=2"`` (grammar in
            `eval.tasks`), or tasks from `load_tasks`.
        batch_size: items (or windows, or prompts) per forward pass; left at its default,
            generation sizes its batches by memory (`eval.generation.generation_batches`).
        limit: score only the first N items of each task (each language for ppl; each Copain
            task); demonstrations are still drawn from the whole file.
        seed: chooses demonstrations and Copain items; the same seed gives the same result.
        max_length: longest sequence fed to the model: perplexity window, and the limit prompts
            are cut to (from the left). Default: the model's context length.
        progress: show progress bars.
        log_samples: write one JSON line per scored item (or document) to this file: its
            context, choices with their log-likelihoods and lengths, prediction and gold (or a
            document's log-likelihood, tokens, words and bytes; or a prompt and its generation),
            each with its doc_id and prompt_sha256; or a function called with each record.
        prefix_cache: multiple choice: run the token prefix most contexts share (the
            demonstrations) once and score from its KV cache (the same scores, faster); False
            runs every context whole.
        items: score only these items of every task (indices among the first `limit`, as
            `eval.study.halves` chooses a half); their prompts are those of a whole run.

    Returns:
        ``{"metrics": {"<task>/<metric>": value, "<task>/n": count, ...},
        "config": {model, dtype, device, seed, ..., "tasks": {<task>: settings}}}``.

    Raises:
        TaskSpecError: a bad task string, or two tasks with one name.
        EvalDataError: a malformed data file.
        ValueError: batch_size, limit or max_length below 1.
    """
    for label, value in (("batch_size", batch_size), ("limit", limit), ("max_length", max_length)):
        if value is not None and value < 1:
            raise ValueError(f"{label} must be at least 1, got {value}")
    loaded = load_tasks(tasks)
    with ExitStack() as stack:
        log = log_samples if callable(log_samples) else None
        if log_samples is not None and log is None:
            Path(log_samples).parent.mkdir(parents=True, exist_ok=True)
            handle = stack.enter_context(open(log_samples, "w", encoding="utf-8"))

            def log(record: dict[str, Any]) -> None:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")

        settings = Settings(
            batch_size=batch_size,
            limit=limit,
            seed=seed,
            max_length=max_length or model_context(model) or FALLBACK_MAX_LENGTH,
            progress=progress,
            prefix_cache=prefix_cache,
            log=log,
            items=frozenset(items) if items is not None else None,
        )
        metrics, task_configs = _run_tasks(model, tokenizer, loaded, settings)
    return {"metrics": metrics, "config": _run_config(model, tokenizer, settings, task_configs)}


def score_checkpoint(
    checkpoint: str,
    tasks: Sequence[str],
    scoring: ScoringOptions,
    *,
    tokenizer: str | None = None,
    progress: bool = True,
    log_samples: str | Path | None = None,
    prefix_cache: bool = True,
) -> dict[str, Any]:
    """`surgery eval CHECKPOINT -t ...`: read the tasks' data, load the checkpoint on the
    scoring options' device and dtype, and score it; `evaluate`'s result, its config naming the
    checkpoint as given.

    Raises:
        TaskSpecError, EvalDataError: bad tasks or data (before the model loads).
        ModelError: the checkpoint, the device or the dtype.
    """
    scoring = scoring.resolved()
    loaded = load_tasks(list(tasks))
    model, tok = load_model(
        checkpoint, scoring.device, scoring.dtype, tokenizer=tokenizer, progress=progress
    )
    result = evaluate(
        model,
        tok,
        loaded,
        batch_size=scoring.batch_size,
        limit=scoring.limit,
        seed=scoring.seed,
        max_length=scoring.max_length,
        progress=progress,
        log_samples=log_samples,
        prefix_cache=prefix_cache,
    )
    result["config"]["model"] = checkpoint
    return result


def _run_tasks(
    model: Any, tokenizer: Any, loaded: list[Task], settings: Settings
) -> tuple[dict[str, float | int], dict[str, dict[str, Any]]]:
    metrics: dict[str, float | int] = {}
    task_configs: dict[str, dict[str, Any]] = {}
    was_training = model.training
    model.eval()  # dropout off: scores must not depend on the caller's mode
    try:
        for task in loaded:
            task_metrics, info = task.run(model, tokenizer, settings)
            name = task.spec.name
            metrics.update({f"{name}/{key}": value for key, value in task_metrics.items()})
            task_configs[name] = {"task": task.spec.text, **task.config(), **info}
    finally:
        model.train(was_training)
    return metrics, task_configs


def _run_config(
    model: Any, tokenizer: Any, settings: Settings, tasks: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    # No timestamps or hostnames: the same run must give byte-identical JSON.
    return {
        "model": str(getattr(model, "name_or_path", "") or type(model).__name__),
        "model_class": type(model).__name__,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "device": str(model_device(model)),
        "seed": settings.seed,
        "batch_size": settings.batch_size,
        "limit": settings.limit,
        "max_length": settings.max_length,
        "threads": torch.get_num_threads(),
        "versions": {
            "torch": torch.__version__,
            "transformers": importlib.metadata.version("transformers"),
            "sacrebleu": importlib.metadata.version("sacrebleu"),
        },
        "tasks": tasks,
    }
