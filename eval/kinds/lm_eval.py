"""``lm-eval``: lm-evaluation-harness tasks on the model in memory (`eval.harness`)."""

from __future__ import annotations

from eval.kinds.base import ADD_BOS, Kind, Option, count, flag, register


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
        loader="eval.harness:HarnessTask.from_spec",
    )
)
