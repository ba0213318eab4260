"""``copain``: the generated Copain-style in-context-learning probe (`eval.copain`)."""

from __future__ import annotations

from eval.kinds.base import ADD_BOS, Kind, Option, count, register, shots

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
        loader="eval.copain:CopainTask.from_spec",
    )
)
