"""The scoring options as a suite run takes them (`eval.options.ScoringOptions` -> `SuiteRun`)."""

from __future__ import annotations

from typing import Any

from eval.options import ScoringOptions
from eval.study.runner import SuiteRun


def suite_run(options: ScoringOptions, **more: Any) -> SuiteRun:
    """`options` as `run_suite` takes them, with `more` of `SuiteRun`'s own fields (progress,
    tokenizer, few-shot seeds, ...)."""
    return SuiteRun(
        device=options.device,
        dtype=options.dtype,
        batch_size=options.batch_size,
        limit=options.limit,
        seed=options.seed,
        max_length=options.max_length,
        half=options.half,
        split_seed=options.split_seed,
        **more,
    )
