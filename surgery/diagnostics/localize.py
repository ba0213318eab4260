"""localize: which block of layers carries each metric's change? Revert one block at a time.

For each block (and alpha: 0 reverts it fully), the block's layers are set to BASE (or the blend)
in memory, everything else stays TRAINED, and the model is scored. A block's recovery of a metric
is (score - score_trained) / (score_base - score_trained): 1 means reverting that block alone
restores BASE's score, 0 means it changes nothing.

A recovery is only as good as the gap it divides by: where BASE and TRAINED differ by no more than
the metric's noise (`noise`: from the standard error its kind has, over items or documents, never
from its value), no recovery is reported (NaN, shown as "within noise"), and a best block is
named only when its own change from TRAINED exceeds that noise. Perplexities are judged and
recovered on the log scale (their mean NLL), so ppl, byte perplexity and bits per byte agree.
Where training improved a metric (`metric_kinds.lower_is_better` says which way), the best block
is the one carrying the gain, not a "recovery".
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from surgery.api import warn_if_swapped
from surgery.core.layers import LayerValues, require_modules, select_stack
from surgery.core.modules import parse_module_filter
from surgery.diagnostics.blocks import Block, parse_block_plan
from surgery.diagnostics.memory_blend import MemoryBlender
from surgery.diagnostics.metric_kinds import (
    PROPORTIONS,
    STDERR_SUFFIX,
    is_perplexity,
    judged,
    judged_stderr,
    leaf,
    lower_is_better,
)
from surgery.diagnostics.results import announce, metric_names, write_results
from surgery.diagnostics.scoring import Scorer
from surgery.engine.output_dir import check_output, staged_output
from surgery.engine.reader import Checkpoint
from surgery.hub.resolve import open_input
from surgery.merge_stages import input_identity

# Below this relative difference a metric without a standard error (chrF: a corpus score) counts
# as unchanged: a blend rounded to bf16 storage moves a score by about this much.
RELATIVE_NOISE = 1e-4


def _stderr(metric: str, scores: dict[str, float]) -> float | None:
    """The metric's standard error in `scores`, on the judged scale: the one eval reports
    (`METRIC_stderr`: accuracies over items, perplexities over documents), else the binomial
    one of a proportion over `<task>/n` items; None when the metric's kind gives none."""
    value, reported = scores[metric], scores.get(f"{metric}{STDERR_SUFFIX}")
    if isinstance(reported, int | float) and math.isfinite(reported):
        return judged_stderr(metric, value, reported)
    n = scores.get(f"{metric.rsplit('/', 1)[0]}/n")
    if leaf(metric) in PROPORTIONS and isinstance(n, int | float) and n > 0:
        return math.sqrt(value * (1 - value) / n)
    return None


def noise(metric: str, base: dict[str, float], trained: dict[str, float]) -> float:
    """The smallest difference of `metric` between two scores that is more than noise, on the
    metric's judged scale (`metric_kinds.judged`: log for perplexities).

    Twice the standard error of the difference, from each score's standard error (see
    `_stderr`); a metric whose kind gives none: 0.01% of the larger magnitude.
    """
    errors = (_stderr(metric, base), _stderr(metric, trained))
    if None not in errors:
        return 2 * math.hypot(*errors)
    b, t = judged(metric, base[metric]), judged(metric, trained[metric])
    return RELATIVE_NOISE * max(abs(b), abs(t))


def recovery(score: float, trained: float, base: float, floor: float = 0.0) -> float:
    """Where `score` lies from TRAINED (0) to BASE (1); NaN if they differ by `floor` or less."""
    if abs(base - trained) <= floor or any(math.isnan(v) for v in (score, trained, base)):
        return math.nan
    return (score - trained) / (base - trained)


def pair_identity(base: Checkpoint, trained: Checkpoint) -> str:
    """sha256 of BASE's and TRAINED's identities, in that order (`merge_stages.input_identity`:
    a Hub commit, the shard hashes a surgery output records, else each file's name, size and
    modification time with its header's tensor table): what a localize run was run on."""
    record = [input_identity(base), input_identity(trained)]
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


def _improved(metric: str, base: float, trained: float) -> bool:
    """Whether training made the metric better (lower perplexity, higher accuracy)."""
    return trained < base if lower_is_better(metric) else trained > base


@dataclass
class Localization:
    """Scores of BASE, TRAINED and every (block, alpha), and each one's recovery per metric
    (computed on the judged scale, so a perplexity's recovery is its NLL's)."""

    base: dict[str, float]
    trained: dict[str, float]
    rows: list[dict] = field(default_factory=list)  # block, alpha, metrics, recovery/<metric>
    metrics: list[str] = field(default_factory=list)  # metrics that BASE and TRAINED differ on
    noise: dict[str, float] = field(default_factory=dict)  # per metric, judged scale (`noise`)
    within_noise: list[str] = field(default_factory=list)  # moved, but not beyond noise
    modules: str | None = None  # the --modules filter that narrowed each block, if any
    mode: str = "blocks"  # how blocks were formed (`BlockPlan.mode`): window rows get a curve
    inputs: dict = field(default_factory=dict)  # BASE, TRAINED and their `pair_identity`

    def improved(self) -> list[str]:
        """Metrics training made better beyond noise (reverting a block gives the gain back)."""
        return [
            m
            for m in self.metrics
            if m not in self.within_noise and _improved(m, self.base[m], self.trained[m])
        ]

    def best(self) -> dict[str, str]:
        """The block whose reversion recovers the most, per metric, when that block's own change
        from TRAINED is more than noise (metrics where none is are left out). For a metric that
        training improved, that block carries most of the gain: reverting it loses the most."""
        winners = {}
        for metric in self.metrics:
            trained = judged(metric, self.trained[metric])
            meaningful = [
                r
                for r in self.rows
                if not math.isnan(r[f"recovery/{metric}"])
                and abs(judged(metric, r[metric]) - trained) > self.noise[metric]
            ]
            if meaningful:
                top = max(meaningful, key=lambda r: r[f"recovery/{metric}"])
                winners[metric] = f"{block_label(top)} @ alpha {top['alpha']:g}"
        return winners


def block_label(row: dict) -> str:
    """A row's block as printed: its layers, and for a band its first/last counts
    (`9:28 (first 9, last 6)`)."""
    if "first" in row:
        return f"{row['block']} (first {row['first']}, last {row['last']})"
    return row["block"]


def attribute(result: Localization) -> None:
    """Keep the metrics BASE and TRAINED differ on, with their noise and whether the difference
    is within it. Those that agree have no recovery to attribute; those within noise get none
    either (dividing by noise gives nonsense like -6)."""
    for metric in metric_names([result.trained]):
        if result.base[metric] == result.trained[metric]:
            continue
        result.noise[metric] = noise(metric, result.base, result.trained)
        result.metrics.append(metric)
        gap = judged(metric, result.base[metric]) - judged(metric, result.trained[metric])
        if not abs(gap) > result.noise[metric]:  # NaN (a perplexity of 0?) counts as noise
            result.within_noise.append(metric)


def _recoveries(result: Localization, metrics: dict[str, float]) -> dict[str, float]:
    return {
        f"recovery/{m}": recovery(
            judged(m, metrics[m]),
            judged(m, result.trained[m]),
            judged(m, result.base[m]),
            result.noise[m],
        )
        for m in result.metrics
    }


def run_localize(
    base: str | Path,
    trained: str | Path,
    scorer: Scorer,
    *,
    blocks: str | None = None,
    block_size: int | None = None,
    window: int | None = None,
    stride: int | None = None,
    boundaries: str | None = None,
    alphas: Sequence[float] = (0.0,),
    stack: str | None = None,
    modules: str | None = None,
    out_dir: str | Path | None = None,
    force: bool = False,
    quiet: bool = False,
) -> Localization:
    """Score TRAINED, BASE and TRAINED with each block reverted (at each alpha); with `out_dir`,
    also write localize.json, localize.csv and localize.png there (checked before any scoring).
    Blocks are one of (see `surgery.diagnostics.blocks`): `blocks` (slices), `block_size`,
    `window` (sliding by `stride`, default 1) or `boundaries` (`9,6;6,6`: the band between the
    first F and the last L layers); they are checked against the stack's layer count from the
    headers before any model loads. With `modules` (see `surgery.core.modules`) only those
    tensors of a block revert. `scorer` (see `surgery.diagnostics.scoring`) loads the models
    and scores each blend.

    Raises:
        LayerSpecError: bad blocks or modules.
        OutputError: `out_dir` exists (without `force`) or overlaps an input.
        SurgeryError: bad inputs.
    """
    plan = parse_block_plan(blocks, block_size, window, stride, boundaries)
    base_ckpt, trained_ckpt = open_input(base), open_input(trained)
    warn_if_swapped(base_ckpt, trained_ckpt)
    on_disk = select_stack(trained_ckpt.stacks, stack)
    block_list = plan.resolve(on_disk.num_layers)
    if out_dir is not None:
        check_output(Path(out_dir), [base_ckpt.path, trained_ckpt.path], force)
    blender = MemoryBlender(base_ckpt, trained_ckpt, scorer.load)
    chosen = blender.stack(stack)
    module_filter = parse_module_filter(modules) if modules is not None else None
    if module_filter is not None:
        for block in block_list:
            require_modules(module_filter, blender.params, chosen, block.layers)

    def score(values: LayerValues) -> dict[str, float]:
        blender.set_alphas(values, chosen, module_filter)
        return scorer(blender.model, blender.tokenizer, progress=not quiet)

    result = Localization(base=score(LayerValues(default=0.0)), trained=score(LayerValues()))
    result.modules, result.mode = modules, plan.mode
    result.inputs = {
        "base": str(base_ckpt.spec),
        "trained": str(trained_ckpt.spec),
        "identity": pair_identity(base_ckpt, trained_ckpt),
        "stack": on_disk.name,
        "num_layers": on_disk.num_layers,
    }
    attribute(result)
    step, total = 0, len(block_list) * len(alphas)
    for block in block_list:
        for alpha in alphas:
            step += 1
            announce("localize", step, total, f"block {block.label}, alpha {alpha:g}", quiet)
            metrics = score(LayerValues(per_layer=dict.fromkeys(block.layers, alpha)))
            result.rows.append(_row(result, block, alpha, metrics))
    if out_dir is not None:
        title = f"Recovery by reverted block: {Path(trained_ckpt.spec).name}"
        save_localization(result, Path(out_dir), title)
    return result


def _row(result: Localization, block: Block, alpha: float, metrics: dict) -> dict:
    """A row: the block, its window or band columns, alpha, the scores and the recoveries."""
    row = {"block": block.label, **block.fields, "alpha": alpha, **metrics}
    return row | _recoveries(result, metrics)


def format_localization(result: Localization) -> str:
    """A table of recoveries (blocks x metrics), what lies within noise, and the block that
    recovers each metric most (only where that is more than noise)."""
    width = max(12, *(len(m) for m in result.metrics)) if result.metrics else 12

    def cell(value: float) -> str:
        return f"{'-':>{width}}" if math.isnan(value) else f"{value:>{width}.3f}"

    blocks = max(12, *(len(block_label(row)) for row in result.rows)) if result.rows else 12
    header = f"{'block':>{blocks}} {'alpha':>6}  " + "  ".join(
        f"{m:>{width}}" for m in result.metrics
    )
    lines = ["recovery: 0 = as TRAINED, 1 = as BASE; - = within noise", header]
    for row in result.rows:
        cells = "  ".join(cell(row[f"recovery/{m}"]) for m in result.metrics)
        lines.append(f"{block_label(row):>{blocks}} {row['alpha']:>6g}  {cells}")
    for metric in result.within_noise:
        lines.append(f"{metric}: {_scores(result, metric)}, within noise; no recovery reported")
    best, improved = result.best(), result.improved()
    for metric in result.metrics:
        if metric in result.within_noise:
            continue
        if metric not in best:
            lines.append(f"no block alone moves {metric} beyond noise")
        elif metric in improved:
            lines.append(
                f"{metric} improved in training ({_scores(result, metric)}); reverting block "
                f"{best[metric]} gives back the most of the gain"
            )
        else:
            lines.append(f"most recovery of {metric}: block {best[metric]}")
    return "\n".join(lines)


def _scores(result: Localization, metric: str) -> str:
    scale = "log " if is_perplexity(metric) else ""
    gap = abs(judged(metric, result.base[metric]) - judged(metric, result.trained[metric]))
    return (
        f"BASE {result.base[metric]:.4g}, TRAINED {result.trained[metric]:.4g} "
        f"({scale}difference {gap:.3g}, noise {result.noise[metric]:.3g})"
    )


def save_localization(result: Localization, out_dir: Path, title: str) -> Path:
    """localize.json, localize.csv and localize.png in `out_dir`, replacing it (the caller has
    checked `out_dir` with `check_output`). The plot is a recovery heatmap, or for sliding
    windows each metric's score against the window's centre (`plot_window_curve`)."""
    with staged_output(out_dir) as staging:
        config = {
            "base_scores": result.base,
            "trained_scores": result.trained,
            "noise": result.noise,
            "noise_scale": {m: "log" if is_perplexity(m) else "linear" for m in result.metrics},
            "within_noise": result.within_noise,
            "improved_in_training": result.improved(),
            "best": result.best(),
            "modules": result.modules,
            "blocks": result.mode,
            "inputs": result.inputs,
        }
        write_results(result.rows, staging, "localize", config)
        if result.metrics and result.mode == "window":
            from surgery.diagnostics.plots import plot_window_curve

            # Metrics whose whole change is within noise would be flat lines inside a band.
            drawn = [m for m in result.metrics if m not in result.within_noise] or result.metrics
            plot_window_curve(
                result.rows,
                {m: (result.base[m], result.trained[m], result.noise[m]) for m in drawn},
                staging / "localize.png",
                title.replace("Recovery by reverted block", "Score by reverted window"),
            )
        elif result.metrics:
            from surgery.diagnostics.heatmaps import plot_recovery

            blocks = [block_label(row) for row in result.rows]
            plot_recovery(result.rows, result.metrics, blocks, staging / "localize.png", title)
    return out_dir
