"""Stock lm-evaluation-harness on local data: task YAMLs that include lm-eval's own task configs
(Belebele, Global-PIQA, PIQA) and point them at local JSON-lines files; no download."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# Set before `datasets` is imported anywhere: the local JSON builder needs no network.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def lm_eval_tasks_root() -> Path:
    """The folder of lm-eval's bundled task configs."""
    import lm_eval

    return Path(lm_eval.__file__).parent / "tasks"


def write_task_yamls(folder: Path, files: dict[str, Path]) -> dict[str, str]:
    """Local copies of lm-eval's Belebele, Global-PIQA, PIQA and a rolling perplexity task.

    Args:
        folder: where the YAMLs go.
        files: kind -> local data file; kinds ``belebele``, ``global_piqa``, ``piqa``, ``ppl``.

    Returns:
        kind -> lm-eval task name.
    """
    root = lm_eval_tasks_root()
    folder.mkdir(parents=True, exist_ok=True)
    bodies = {
        "belebele": f"include: {root}/belebele/_default_template_yaml\n"
        "test_split: test\nfewshot_split: test\n",
        "global_piqa": f"include: {root}/global_piqa/nonparallel_cloze/_template\n"
        "test_split: test\n",
        # lm-eval's piqa evaluates `validation` and draws demonstrations from `train`.
        "piqa": f"include: {root}/piqa/piqa.yaml\n",
        "ppl": "output_type: loglikelihood_rolling\ntest_split: test\ndoc_to_text: ''\n"
        "doc_to_target: '{{text}}'\nmetric_list:\n  - metric: word_perplexity\n"
        "  - metric: byte_perplexity\n  - metric: bits_per_byte\n",
    }
    names = {}
    for kind, path in files.items():
        name = f"local_{kind}"
        splits = "train: {p}\n    validation: {p}" if kind == "piqa" else "test: {p}"
        (folder / f"{name}.yaml").write_text(
            bodies[kind]
            + f"task: {name}\ndataset_path: json\ndataset_name: null\n"
            + "dataset_kwargs:\n  data_files:\n    "
            + splits.format(p=path)
            + "\n",
            encoding="utf-8",
        )
        names[kind] = name
    return names


def write_custom_yaml(folder: Path, name: str, path: Path, keys: dict[str, Any]) -> str:
    """A multiple-choice task of lm-eval's own on a local JSON-lines file, demonstrations from
    the evaluated split (``fewshot_split: test``), with the given template keys; its name."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    body = {
        "task": name,
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {"test": str(path)}},
        "test_split": "test",
        "fewshot_split": "test",
        "output_type": "multiple_choice",
        **keys,
        "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}],
    }
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(body, sort_keys=False), "utf-8")
    return name


def run_lm_eval(
    model: Any,
    tokenizer: Any,
    task_folder: Path,
    tasks: list[str],
    shots: int,
    max_length: int,
    batch_size: int = 4,
) -> dict[str, Any]:
    """`lm_eval.simple_evaluate` with the model in memory; returns results and samples."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length)
    return lm_eval.simple_evaluate(
        model=lm,
        tasks=tasks,
        num_fewshot=shots,
        task_manager=TaskManager(include_path=str(task_folder), include_defaults=False),
        log_samples=True,
    )


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    """Write rows as JSON lines."""
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return path
