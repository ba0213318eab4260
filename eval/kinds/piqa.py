"""``piqa``: Global-PIQA or classic PIQA, cloze, in lm-eval's prompts, scored as multiple
choice (`eval.kinds.mc`).

- Global-PIQA (``prompt``, ``solution0``.., ``label``): the prompt as is, choices the solutions;
  demonstrations lm-eval's ``default`` sampler (seeded 1234, from the whole file); acc_bytes
  as well, as lm-eval reports it.
- Classic PIQA (``goal``, ``sol1``, ``sol2``, ``label``): ``Question: <goal>\\nAnswer:``.
"""

from __future__ import annotations

from pathlib import Path

from eval.data import Row
from eval.kinds.base import MC_OPTIONS, Kind, TaskSpec, register
from eval.kinds.mc import McItem, MultipleChoiceTask, Schema, read_items


def _global_piqa(row: Row) -> McItem:
    count = 0
    while f"solution{count}" in row.data:
        count += 1
    solutions = [row.text(f"solution{n}") for n in range(max(count, 2))]
    return McItem(
        row.text("prompt"), solutions, row.label("label", range(len(solutions))), row.data
    )


def _classic_piqa(row: Row) -> McItem:
    solutions = [row.text("sol1"), row.text("sol2")]
    question = f"Question: {row.text('goal')}\nAnswer:"
    return McItem(question, solutions, row.label("label", range(2)), row.data)


GLOBAL_PIQA = Schema(
    "global_piqa", _global_piqa, "default", False, ("acc", "acc_norm", "acc_bytes")
)
CLASSIC_PIQA = Schema("piqa", _classic_piqa, "default", True, ("acc", "acc_norm"))


def schema(spec: TaskSpec, rows: list[Row]) -> Schema:
    """Classic PIQA when the first row has ``goal``, else Global-PIQA."""
    return CLASSIC_PIQA if "goal" in rows[0].data else GLOBAL_PIQA


def read_piqa(path: Path) -> list[McItem]:
    """Read PIQA rows: Global-PIQA's (prompt, solution0.., label) or classic (goal, sol1, sol2)."""
    return read_items(schema, path)[1]


def load(spec: TaskSpec) -> MultipleChoiceTask:
    """The ``piqa`` kind's loader."""
    return MultipleChoiceTask.from_spec(spec, schema)


KIND = register(
    Kind(
        "piqa",
        "PATH",
        "PIQA rows (.jsonl[.gz] or .parquet, a snapshot folder of "
        "mrlbenchmarks/global-piqa-nonparallel with config=CONFIG, or "
        "hub:mrlbenchmarks/global-piqa-nonparallel#CONFIG@test[@REVISION]), cloze, in lm-eval's "
        "prompts: Global-PIQA (prompt, "
        "solution0.., label; acc, acc_norm, acc_bytes) or classic PIQA (goal, sol1, sol2, label; "
        "acc, acc_norm); demonstrations default",
        MC_OPTIONS,
        loader=load,
        hub=True,
        sampler="default",
    )
)
