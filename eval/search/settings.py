"""What `surgery search` is given, as one typed value (click only at import, with the suite's run
settings: `surgery --help` stays fast)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eval.study.runner import SuiteRun


@dataclass(frozen=True)
class SearchOptions:
    """What `surgery search` is given (validated by `eval.search.run.check`).

    The command line builds the search's own options first (`eval.search.command`), then adds
    BASE, TRAINED, the suite, the folder and the scoring options; a search without them is
    refused by `check`.
    """

    base: str = ""
    trained: str = ""
    suite: Path | None = None
    out: Path | None = None
    blocks: str = "4"
    embeddings: bool = False
    step: float = 0.05
    measure: str | None = None
    objectives: str | None = None
    budgets: tuple[str, ...] = ()
    trials: int = 50
    time: float | None = None  # seconds
    seed: int = 0
    split_seed: int = 0
    baseline_layers: str | None = None
    uniform: tuple[float, ...] = (0.25, 0.5, 0.75)
    storage: str | None = None
    resamples: int = 2000
    eval: SuiteRun = field(default_factory=SuiteRun)
    quiet: bool = False
