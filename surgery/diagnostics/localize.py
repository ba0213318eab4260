"""localize: which block of layers carries each metric's change? Revert one block at a time.

For each block (and alpha: 0 reverts it fully), the block's layers are set to BASE (or the blend)
in memory, everything else stays TRAINED, and the model is scored. A block's recovery of a metric
is (score - score_trained) / (score_base - score_trained): 1 means reverting that block alone
restores BASE's score, 0 means it changes nothing.

A recovery is only as good as the gap it divides by: where BASE and TRAINED differ by no more than
the metric's noise (`noise`), no recovery is reported (NaN, shown as "within noise"), and a best
block is named only when its own change from TRAINED exceeds that noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from surgery.core.errors import LayerSpecError
from surgery.core.layers import LayerValues, format_layers, parse_layer_spec
from surgery.diagnostics.memory_blend import MemoryBlender
from surgery.diagnostics.results import announce, metric_names, write_results
from surgery.engine.output_dir import check_output, staged_output
from surgery.hub.resolve import open_input


def parse_blocks(text: str | None, block_size: int | None, num_layers: int) -> list[list[int]]:
    """Blocks from `0:9,9:28,28:34` (each comma-separated item one block) or a width.

    Raises:
        LayerSpecError: neither or both given, a bad item, or a width below 1.
    """
    if (text is None) == (block_size is None):
        raise LayerSpecError("give either --blocks (e.g. 0:9,9:28,28:34) or --block-size")
    if block_size is not None:
        if block_size < 1:
            raise LayerSpecError(f"--block-size must be at least 1, got {block_size}")
        return [
            list(range(i, min(i + block_size, num_layers)))
            for i in range(0, num_layers, block_size)
        ]
    return [parse_layer_spec(item, num_layers) for item in text.split(",")]


# Below this relative difference a metric without a standard error counts as unchanged: a blend
# rounded to bf16 storage moves a perplexity by about this much with no change of meaning.
RELATIVE_NOISE = 1e-4


def noise(metric: str, base: dict[str, float], trained: dict[str, float]) -> float:
    """The smallest difference of `metric` between two scores that is more than noise.

    Twice the standard error of the difference when the eval reports one (`METRIC_stderr`), or
    when the metric is a proportion with a known item count (`<task>/n`, binomial error);
    otherwise 0.01% of the larger magnitude.
    """
    se_keys = (f"{metric}_stderr", f"{metric}/stderr")
    for key in se_keys:
        if key in base and key in trained:
            return 2 * math.hypot(base[key], trained[key])
    n = base.get(f"{metric.rsplit('/', 1)[0]}/n")
    b, t = base[metric], trained[metric]
    if isinstance(n, int | float) and n > 0 and 0 <= b <= 1 and 0 <= t <= 1:
        return 2 * math.sqrt((b * (1 - b) + t * (1 - t)) / n)
    return RELATIVE_NOISE * max(abs(b), abs(t))


def recovery(score: float, trained: float, base: float, floor: float = 0.0) -> float:
    """Where `score` lies from TRAINED (0) to BASE (1); NaN if they differ by `floor` or less."""
    if abs(base - trained) <= floor or any(math.isnan(v) for v in (score, trained, base)):
        return math.nan
    return (score - trained) / (base - trained)


@dataclass
class Localization:
    """Scores of BASE, TRAINED and every (block, alpha), and each one's recovery per metric."""

    base: dict[str, float]
    trained: dict[str, float]
    rows: list[dict] = field(default_factory=list)  # block, alpha, metrics, recovery/<metric>
    metrics: list[str] = field(default_factory=list)  # metrics that BASE and TRAINED differ on
    noise: dict[str, float] = field(default_factory=dict)  # per metric (see `noise`)
    within_noise: list[str] = field(default_factory=list)  # moved, but not beyond noise

    def best(self) -> dict[str, str]:
        """The block whose reversion recovers the most, per metric, when that block's own change
        from TRAINED is more than noise (metrics where none is are left out)."""
        winners = {}
        for metric in self.metrics:
            meaningful = [
                r
                for r in self.rows
                if not math.isnan(r[f"recovery/{metric}"])
                and abs(r[metric] - self.trained[metric]) > self.noise[metric]
            ]
            if meaningful:
                top = max(meaningful, key=lambda r: r[f"recovery/{metric}"])
                winners[metric] = f"{top['block']} @ alpha {top['alpha']:g}"
        return winners


def run_localize(
    base: str | Path,
    trained: str | Path,
    tasks: Sequence[str],
    *,
    blocks: str | None = None,
    block_size: int | None = None,
    alphas: Sequence[float] = (0.0,),
    stack: str | None = None,
    eval_options: dict | None = None,
    out_dir: str | Path | None = None,
    force: bool = False,
    quiet: bool = False,
) -> Localization:
    """Score TRAINED, BASE and TRAINED with each block reverted (at each alpha); with `out_dir`,
    also write localize.json, localize.csv and localize.png there (checked before any scoring).

    Raises:
        LayerSpecError: bad blocks.
        OutputError: `out_dir` exists (without `force`) or overlaps an input.
        SurgeryError: bad inputs or tasks.
    """
    from eval.api import evaluate, load_tasks

    loaded = load_tasks(tasks)
    base_ckpt, trained_ckpt = open_input(base), open_input(trained)
    if out_dir is not None:
        check_output(Path(out_dir), [base_ckpt.path, trained_ckpt.path], force)
    options = dict(eval_options or {})
    load_options = {"device": options.pop("device", "cpu"), "dtype": options.pop("dtype", None)}
    blender = MemoryBlender(base_ckpt, trained_ckpt, **load_options)
    chosen = blender.stack(stack)
    block_layers = parse_blocks(blocks, block_size, chosen.num_layers)

    def score(values: LayerValues) -> dict[str, float]:
        blender.set_alphas(values, chosen)
        return evaluate(blender.model, blender.tokenizer, loaded, progress=not quiet, **options)[
            "metrics"
        ]

    result = Localization(base=score(LayerValues(default=0.0)), trained=score(LayerValues()))
    # Metrics on which BASE and TRAINED agree have no recovery to attribute; those that moved
    # by no more than their noise get none either (dividing by noise gives nonsense like -6).
    for metric in metric_names([result.trained]):
        if result.base[metric] == result.trained[metric]:
            continue
        result.noise[metric] = noise(metric, result.base, result.trained)
        result.metrics.append(metric)
        if abs(result.base[metric] - result.trained[metric]) <= result.noise[metric]:
            result.within_noise.append(metric)
    step, total = 0, len(block_layers) * len(alphas)
    for layers in block_layers:
        for alpha in alphas:
            step += 1
            announce(
                "localize", step, total, f"block {format_layers(layers)}, alpha {alpha:g}", quiet
            )
            metrics = score(LayerValues(per_layer=dict.fromkeys(layers, alpha)))
            row = {"block": format_layers(layers), "alpha": alpha, **metrics}
            for metric in result.metrics:
                row[f"recovery/{metric}"] = recovery(
                    metrics[metric],
                    result.trained[metric],
                    result.base[metric],
                    result.noise[metric],
                )
            result.rows.append(row)
    if out_dir is not None:
        title = f"Recovery by reverted block: {Path(trained_ckpt.spec).name}"
        save_localization(result, Path(out_dir), title)
    return result


def format_localization(result: Localization) -> str:
    """A table of recoveries (blocks x metrics), what lies within noise, and the block that
    recovers each metric most (only where that is more than noise)."""
    width = max(12, *(len(m) for m in result.metrics)) if result.metrics else 12

    def cell(value: float) -> str:
        return f"{'-':>{width}}" if math.isnan(value) else f"{value:>{width}.3f}"

    header = f"{'block':>12} {'alpha':>6}  " + "  ".join(f"{m:>{width}}" for m in result.metrics)
    lines = ["recovery: 0 = as TRAINED, 1 = as BASE; - = within noise", header]
    for row in result.rows:
        cells = "  ".join(cell(row[f"recovery/{m}"]) for m in result.metrics)
        lines.append(f"{row['block']:>12} {row['alpha']:>6g}  {cells}")
    for metric in result.within_noise:
        gap = abs(result.base[metric] - result.trained[metric])
        lines.append(
            f"{metric}: BASE and TRAINED differ by {gap:.3g}, within noise "
            f"({result.noise[metric]:.3g}); no recovery reported"
        )
    best = result.best()
    for metric in result.metrics:
        if metric in best:
            lines.append(f"most recovery of {metric}: block {best[metric]}")
        elif metric not in result.within_noise:
            lines.append(f"no block alone moves {metric} beyond noise")
    return "\n".join(lines)


def save_localization(result: Localization, out_dir: Path, title: str) -> Path:
    """localize.json, localize.csv and localize.png (recovery heatmap) in `out_dir`, replacing it
    (the caller has checked `out_dir` with `check_output`)."""
    with staged_output(out_dir) as staging:
        config = {
            "base_scores": result.base,
            "trained_scores": result.trained,
            "noise": result.noise,
            "within_noise": result.within_noise,
            "best": result.best(),
        }
        write_results(result.rows, staging, "localize", config)
        if result.metrics:
            from surgery.diagnostics.plots import plot_heatmap

            labels = [f"{r['block']} @ {r['alpha']:g}" for r in result.rows]
            values = [[r[f"recovery/{m}"] for m in result.metrics] for r in result.rows]
            plot_heatmap(
                values,
                labels,
                result.metrics,
                staging / "localize.png",
                f"{title}\n(recovery: 0 = as trained, 1 = as base)",
                "recovery",
            )
    return out_dir
