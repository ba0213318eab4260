"""``belebele``: Belebele reading comprehension in lm-eval's prompt (`eval.multiple_choice`)."""

from __future__ import annotations

from eval.kinds.base import MC_OPTIONS, Kind, register

KIND = register(
    Kind(
        "belebele",
        "PATH",
        "Belebele reading comprehension rows (.jsonl[.gz] or .parquet, a snapshot folder of "
        "facebook/belebele with config=LANG, or hub:facebook/belebele#LANG@test[@REVISION]) in "
        "lm-eval's prompt; acc, acc_norm and their stderr; demonstrations first_n",
        MC_OPTIONS,
        loader="eval.multiple_choice:load_belebele",
        hub=True,
        sampler="first_n",
        role="cost",
    )
)
