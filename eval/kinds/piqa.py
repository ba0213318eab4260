"""``piqa``: Global-PIQA or classic PIQA, cloze, in lm-eval's prompts (`eval.multiple_choice`)."""

from __future__ import annotations

from eval.kinds.base import MC_OPTIONS, Kind, register

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
        loader="eval.multiple_choice:load_piqa",
        hub=True,
        sampler="default",
    )
)
