"""``copain``: a language-free in-context-learning probe, generated from a seed (no data files).

Seven tasks on short lists; a prompt is k solved examples of one task, one per line, then the
item; the task is never named, so the model must infer it from the examples. The answer is the
greedy first line, scored by exact match. Example (task `max`, 2 shots):

    58 3 91 -> 91
    12 40 7 33 -> 40
    25 66 14 80 2 ->

| task       | input                              | answer                          |
|------------|------------------------------------|---------------------------------|
| max        | 3-7 integers in 0..99              | the largest                     |
| min        | 3-7 integers in 0..99              | the smallest                    |
| median     | 3, 5 or 7 integers in 0..99        | the middle value once sorted    |
| parity     | 4-8 bits                           | 1 if the number of 1s is odd    |
| first_char | 3-7 distinct lowercase letters     | the alphabetically first        |
| last_char  | 3-7 distinct lowercase letters     | the alphabetically last         |
| length     | 2-9 integers in 0..99              | how many there are              |
"""

from __future__ import annotations

import random
import statistics
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eval.data import text_sha256
from eval.errors import TaskSpecError
from eval.kinds.base import ADD_BOS, Kind, Option, Settings, TaskSpec, count, register, shots
from eval.kinds.shots import draw_shots
from eval.tokens import parse_add_bos


@dataclass(frozen=True)
class CopainItem:
    """One list and its answer."""

    values: tuple[str, ...]
    answer: str

    def query(self) -> str:
        """The item as a prompt line, up to the arrow."""
        return " ".join(self.values) + " ->"

    def solved(self) -> str:
        """The item with its answer, as a demonstration line."""
        return f"{self.query()} {self.answer}"


def _numbers(rng: random.Random, lengths: tuple[int, ...]) -> list[int]:
    return [rng.randrange(100) for _ in range(rng.choice(lengths))]


def _letters(rng: random.Random) -> list[str]:
    return rng.sample(string.ascii_lowercase, rng.randint(3, 7))


def _make_max(rng: random.Random) -> CopainItem:
    values = _numbers(rng, (3, 4, 5, 6, 7))
    return CopainItem(tuple(map(str, values)), str(max(values)))


def _make_min(rng: random.Random) -> CopainItem:
    values = _numbers(rng, (3, 4, 5, 6, 7))
    return CopainItem(tuple(map(str, values)), str(min(values)))


def _make_median(rng: random.Random) -> CopainItem:
    values = _numbers(rng, (3, 5, 7))  # odd lengths: the median is one of the integers
    return CopainItem(tuple(map(str, values)), str(statistics.median(values)))


def _make_parity(rng: random.Random) -> CopainItem:
    bits = [rng.randrange(2) for _ in range(rng.randint(4, 8))]
    return CopainItem(tuple(map(str, bits)), str(sum(bits) % 2))


def _make_first_char(rng: random.Random) -> CopainItem:
    letters = _letters(rng)
    return CopainItem(tuple(letters), min(letters))


def _make_last_char(rng: random.Random) -> CopainItem:
    letters = _letters(rng)
    return CopainItem(tuple(letters), max(letters))


def _make_length(rng: random.Random) -> CopainItem:
    values = _numbers(rng, tuple(range(2, 10)))
    return CopainItem(tuple(map(str, values)), str(len(values)))


TASKS: dict[str, Callable[[random.Random], CopainItem]] = {
    "max": _make_max,
    "min": _make_min,
    "median": _make_median,
    "parity": _make_parity,
    "first_char": _make_first_char,
    "last_char": _make_last_char,
    "length": _make_length,
}


def make_items(task: str, n: int, seed: int) -> list[CopainItem]:
    """The `n` items of one task for one seed (same seed, same items, on any machine).

    Args:
        task: a key of `TASKS`.
        n: how many items.
        seed: the run's seed.

    Returns:
        The items.
    """
    rng = random.Random(f"copain/{seed}/{task}")
    return [TASKS[task](rng) for _ in range(n)]


def build_prompts(items: list[CopainItem], count: int, shots: int, key: str) -> list[str]:
    """k-shot prompts for the first `count` items.

    Demonstrations come from the other items of the task, leaving out any with the same list
    as the evaluated item (short bit lists repeat), so the answer is never in the prompt.

    Raises:
        TaskSpecError: fewer distinct other items than `shots`.
    """
    prompts = []
    for index in range(count):
        item = items[index]
        others = [j for j, other in enumerate(items) if other.values != item.values]
        if len(others) < shots:
            raise TaskSpecError(f"copain: {len(others)} distinct items for {shots} shots; raise n")
        chosen = draw_shots(others, shots, f"{key}/{index}")
        prompts.append("\n".join([*(items[j].solved() for j in chosen), item.query()]))
    return prompts


class CopainTask:
    """The seven Copain tasks; items are generated at run time from the seed."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec

    @classmethod
    def from_spec(cls, spec: TaskSpec) -> CopainTask:
        """Check the options (nothing to read).

        Raises:
            TaskSpecError: n too small for the shots.
        """
        if spec.options["n"] <= spec.options["shots"]:
            raise TaskSpecError(f"task {spec.text!r}: n must exceed shots")
        return cls(spec)

    def config(self) -> dict[str, Any]:
        """Tasks, items per task, shots and generation limit."""
        options = self.spec.options
        return {
            "kind": "copain",
            "tasks": list(TASKS),
            "items_per_task": options["n"],
            "shots": options["shots"],
            "max_new_tokens": options["max_new_tokens"],
            "add_bos": options["add_bos"],
        }

    def half_items(self, limit: int | None, seed: int) -> list[int]:
        """Without shots every item (the same indices in each of the seven tasks).

        Raises:
            TaskSpecError: with shots, demonstrations are drawn from the items scored.
        """
        n, shots = self.spec.options["n"], self.spec.options["shots"]
        if shots:
            raise TaskSpecError(
                f"task {self.spec.text!r}: its demonstrations are drawn at random from the "
                "items it scores, so it cannot be split into halves; give shots=0"
            )
        return list(range(min(limit or n, n)))

    def prompts(self, settings: Settings) -> dict[str, tuple[list[str], list[str]]]:
        """task -> (prompts, answers) of the evaluated items (the first `limit` of each task)."""
        n, shots = self.spec.options["n"], self.spec.options["shots"]
        count = min(settings.limit or n, n)
        result = {}
        for task in TASKS:
            items = make_items(task, n, settings.seed)
            key = f"copain/{settings.seed}/{task}"
            answers = [item.answer for item in items[:count]]
            result[task] = (build_prompts(items, count, shots, key), answers)
        return result

    def run(self, model: Any, tokenizer: Any, settings: Settings) -> tuple[dict, dict]:
        """Generate an answer for every item (all tasks in one batched pass) and score them.

        Returns:
            `({<task>/acc, <task>/n for each task, acc, n}, {})`; `acc` is over all items.
        """
        from eval.generation import generate_lines  # torch, once a model scores

        kept = settings.keep(min(settings.limit or self.spec.options["n"], self.spec.options["n"]))
        per_task = {
            task: ([prompts[i] for i in kept], [answers[i] for i in kept])
            for task, (prompts, answers) in self.prompts(settings).items()
        }
        prompts = [p for task_prompts, _ in per_task.values() for p in task_prompts]
        lines = generate_lines(
            model,
            tokenizer,
            prompts,
            max_new_tokens=self.spec.options["max_new_tokens"],
            max_length=settings.max_length,
            batch_size=settings.batch_size,
            progress=settings.progress,
            add_bos=parse_add_bos(self.spec.options["add_bos"]),
            desc="copain",
        )
        metrics: dict[str, float | int] = {}
        hits_total, at = 0, 0
        for task, (task_prompts, answers) in per_task.items():
            task_lines, at = lines[at : at + len(answers)], at + len(answers)
            if settings.log is not None:
                for index, prompt, line, answer in zip(
                    kept, task_prompts, task_lines, answers, strict=True
                ):
                    record = {"task": self.spec.name, "subtask": task, "index": index}
                    record.update(doc_id=f"{task}/{index}", prompt_sha256=text_sha256(prompt))
                    record.update(prompt=prompt, generation=line, gold=answer)
                    settings.log({**record, "acc": int(line == answer)})
            hits = sum(line == answer for line, answer in zip(task_lines, answers, strict=True))
            hits_total += hits
            metrics[f"{task}/acc"] = hits / len(answers)
            metrics[f"{task}/n"] = len(answers)
        metrics["acc"] = hits_total / len(prompts)
        metrics["n"] = len(prompts)
        return metrics, {}


KIND = register(
    Kind(
        "copain",
        None,
        "generated in-context-learning probe (7 tasks, no files), exact match; it generates "
        "Copain-style tasks and is not the published CoPain benchmark (ahmedselhady/CoPain, "
        "scored by its authors as the lm-eval task icp_bench of their lm-eval fork: run that "
        "as lm-eval:icp_bench:include=DIR with the fork's task YAML in DIR, or read it from the "
        "Hub with the exact_match kind, docs/datasets.md)",
        {
            "shots": shots(5),
            "n": Option(count(1), 150, "items per task"),
            "max_new_tokens": Option(count(1), 16, "longest answer generated"),
            "add_bos": ADD_BOS,
        },
        loader=CopainTask.from_spec,
    )
)
