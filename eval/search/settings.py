"""What `surgery search` is given, as one typed value (no import beyond the standard library:
`surgery --help` stays fast). How the models are scored travels beside it, as the suite's run
settings (`eval.study.runner.SuiteRun`, built from `eval.options.ScoringOptions`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SearchOptions:
    """What `surgery search` is given (validated by `eval.search.run.check`).

    The command line builds the search's own options first (`eval.search.command`), then adds
    BASE, TRAINED (the first expert) and the experts, the suite and the folder; a search without
    them is refused by `check`.
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
    baseline_layers: str | None = None
    uniform: tuple[float, ...] = (0.25, 0.5, 0.75)
    storage: str | None = None
    resamples: int = 2000
    quiet: bool = False
    sampler: str = "tpe"  # optuna's sampler: tpe, gp, nsga2 or random (docs/search.md)
    seed_profiles: tuple[str, ...] = ()  # `eval.search.priors`: lines, reverted, localize DIR
    # Several experts: every expert (TRAINED is the first), and their families (`--labels`).
    experts: tuple[str, ...] = ()
    labels: str | None = None

    prune: bool = True  # cut short trials out of the running on a share (`eval.search.pruning`)

    @property
    def inputs(self) -> tuple[str, ...]:
        """The experts: `experts`, or TRAINED alone."""
        return self.experts or ((self.trained,) if self.trained else ())
