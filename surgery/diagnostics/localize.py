"""localize: which block of layers carries each metric's change? Revert one block at a time.

For each block (and alpha: 0 reverts it fully), the block's layers are set to BASE (or the blend)
in memory, everything else stays TRAINED, and the model is scored. A block's recovery of a metric
is (score - score_trained) / (score_base - score_trained): 1 means reverting that block alone
restores BASE's score, 0 means it changes nothing. NaN where BASE and TRAINED score the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from surgery.core.errors import LayerSpecError
from surgery.core.layers import LayerValues, format_layers, parse_layer_spec
from surgery.diagnostics.memory_blend import MemoryBlender
from surgery.diagnostics.sweep import metric_names, write_results
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


def recovery(score: float, trained: float, base: float) -> float:
    """Where `score` lies from TRAINED (0) to BASE (1); NaN if they do not differ."""
    if base == trained or any(math.isnan(v) for v in (score, trained, base)):
        return math.nan
    return (score - trained) / (base - trained)


@dataclass
class Localization:
    """Scores of BASE, TRAINED and every (block, alpha), and each one's recovery per metric."""

    base: dict[str, float]
    trained: dict[str, float]
    rows: list[dict] = field(default_factory=list)  # block, alpha, metrics, recovery/<metric>
    metrics: list[str] = field(default_factory=list)

    def best(self) -> dict[str, str]:
        """The block whose reversion recovers the most, per metric (skipping NaN)."""
        winners = {}
        for metric in self.metrics:
            scored = [r for r in self.rows if not math.isnan(r[f"recovery/{metric}"])]
            if scored:
                top = max(scored, key=lambda r: r[f"recovery/{metric}"])
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
    # Metrics on which BASE and TRAINED agree have no recovery to attribute (always NaN).
    result.metrics = [
        m for m in metric_names([result.trained]) if result.base[m] != result.trained[m]
    ]
    for layers in block_layers:
        for alpha in alphas:
            metrics = score(LayerValues(per_layer=dict.fromkeys(layers, alpha)))
            row = {"block": format_layers(layers), "alpha": alpha, **metrics}
            for metric in result.metrics:
                row[f"recovery/{metric}"] = recovery(
                    metrics[metric], result.trained[metric], result.base[metric]
                )
            result.rows.append(row)
    if out_dir is not None:
        title = f"Recovery by reverted block: {Path(trained_ckpt.spec).name}"
        save_localization(result, Path(out_dir), title)
    return result


def format_localization(result: Localization) -> str:
    """A table of recoveries (blocks x metrics) and the winning block per metric."""
    width = max(12, *(len(m) for m in result.metrics)) if result.metrics else 12
    header = f"{'block':>12} {'alpha':>6}  " + "  ".join(f"{m:>{width}}" for m in result.metrics)
    lines = ["recovery: 0 = as TRAINED, 1 = as BASE", header]
    for row in result.rows:
        cells = "  ".join(f"{row[f'recovery/{m}']:>{width}.3f}" for m in result.metrics)
        lines.append(f"{row['block']:>12} {row['alpha']:>6g}  {cells}")
    for metric, block in result.best().items():
        lines.append(f"most recovery of {metric}: block {block}")
    return "\n".join(lines)


def save_localization(result: Localization, out_dir: Path, title: str) -> Path:
    """localize.json, localize.csv and localize.png (recovery heatmap) in `out_dir`, replacing it
    (the caller has checked `out_dir` with `check_output`)."""
    with staged_output(out_dir) as staging:
        config = {
            "base_scores": result.base,
            "trained_scores": result.trained,
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
