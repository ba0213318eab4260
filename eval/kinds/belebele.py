"""``belebele``: Belebele reading comprehension in lm-eval's prompt, scored as multiple choice
(`eval.kinds.mc`).

The prompt is ``P: <passage>\\nQ: <question, stripped>\\nA: <1>\\n..D: <4>\\nAnswer:``, the
choices ``A``..``D``; demonstrations ``first_n`` (the first rows, never the item).
"""

from __future__ import annotations

from pathlib import Path

from eval.data import Row
from eval.kinds.base import MC_OPTIONS, Kind, TaskSpec, register
from eval.kinds.mc import McItem, MultipleChoiceTask, Schema, read_items

LETTERS = "ABCD"


def _item(row: Row) -> McItem:
    answers = [row.text(f"mc_answer{n}") for n in range(1, 5)]
    options = "".join(f"{letter}: {a}\n" for letter, a in zip(LETTERS, answers, strict=True))
    question = f"P: {row.text('flores_passage')}\nQ: {row.text('question').strip()}\n"
    label = row.label("correct_answer_num", range(1, 5)) - 1
    return McItem(question + options + "Answer:", list(LETTERS), label, row.data)


SCHEMA = Schema("belebele", _item, "first_n", True, ("acc", "acc_norm"))


def schema(spec: TaskSpec, rows: list[Row]) -> Schema:
    """Belebele's rows, whatever the task."""
    return SCHEMA


def read_belebele(path: Path) -> list[McItem]:
    """Read Belebele rows: flores_passage, question, mc_answer1..4, correct_answer_num (1..4)."""
    return read_items(schema, path)[1]


def load(spec: TaskSpec) -> MultipleChoiceTask:
    """The ``belebele`` kind's loader."""
    return MultipleChoiceTask.from_spec(spec, schema)


KIND = register(
    Kind(
        "belebele",
        "PATH",
        "Belebele reading comprehension rows (.jsonl[.gz] or .parquet, a snapshot folder of "
        "facebook/belebele with config=LANG, or hub:facebook/belebele#LANG@test[@REVISION]) in "
        "lm-eval's prompt; acc, acc_norm and their stderr; demonstrations first_n",
        MC_OPTIONS,
        loader=load,
        hub=True,
        sampler="first_n",
        role="cost",
    )
)
