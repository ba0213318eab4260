"""sweep: interpolate BASE -> TRAINED over a grid of alphas, save and/or score every point.

With eval tasks and a model that fits in memory, BASE and TRAINED are loaded once and the layers
in range are set to each blend in place (surgery/memory_blend.py): no checkpoint is written and
re-read between two scores. Otherwise each point is written, loaded and scored.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path

from surgery.api import WRITE, card_file, warn_if_swapped
from surgery.core.errors import SurgeryError
from surgery.diagnostics.memory_blend import MemoryBlender, fits_in_memory
from surgery.diagnostics.results import announce, metric_names, write_results
from surgery.diagnostics.scoring import Scorer
from surgery.engine.ops.interpolate import plan_interpolate, resolve_alphas
from surgery.engine.output_dir import check_output, staged_output
from surgery.engine.writer import execute
from surgery.hub.resolve import open_input
from surgery.options import WriteOptions


def parse_alpha_grid(text: str) -> list[float]:
    """`0:1:0.1` (start:stop:step, stop included when it falls on the grid) or `0,0.5,1`.

    Decimal arithmetic keeps 0.1-steps exact: 0:1:0.1 gives 11 points ending at 1.0.
    """
    try:
        if ":" not in text:
            return [float(Decimal(part)) for part in text.split(",")]
        start, stop, step = (Decimal(part) for part in text.split(":"))
    except (InvalidOperation, ValueError):
        raise SurgeryError(
            f"alpha grid {text!r}: write start:stop:step or a list like 0,0.5,1"
        ) from None
    if step <= 0 or stop < start:
        raise SurgeryError(f"alpha grid {text!r}: needs start <= stop and a positive step")
    count = int((stop - start) / step)
    values = [start + i * step for i in range(count + 1)]
    if len(values) > 1000:
        raise SurgeryError(f"alpha grid {text!r} has {len(values)} points; use a coarser step")
    return [float(v) for v in values]


def point_names(alphas: Sequence[float]) -> list[str]:
    """Folder names that sort with alpha: alpha-0.30, or more decimals when the grid needs them."""
    decimals = max(2, *(len(f"{a:.6f}".rstrip("0").split(".")[1]) for a in alphas))
    return [f"alpha-{a:.{decimals}f}" for a in alphas]


def run_sweep(
    base: str | Path,
    trained: str | Path,
    out_dir: str | Path,
    alphas: Sequence[float],
    *,
    layers: str | None = None,
    stack: str | None = None,
    modules: str | None = None,
    scorer: Scorer | None = None,
    save: bool = True,
    in_memory: bool | None = None,
    extrapolate: bool = False,
    write: WriteOptions = WRITE,
    **changes: object,
) -> list[dict]:
    """Write and/or score one interpolation per alpha into `out_dir`.

    Args:
        alphas: the grid (see `parse_alpha_grid`).
        layers, stack: restrict the blend to these layers (others from TRAINED).
        modules: narrow the layers to these modules (see `surgery.core.modules`).
        scorer: loads and scores each point (see `surgery.diagnostics.scoring`); none means
            only checkpoints are written.
        save: write one checkpoint per alpha (alpha-0.30, ...).
        in_memory: blend in memory for scoring; None decides by whether the model fits.
        extrapolate: allow alphas outside [0, 1].
        write: how checkpoints are written (force, quiet, max_shard_size; `changes` edit a copy).

    Returns:
        One row per alpha: {"alpha": a, "<task>/<metric>": value, ...}.

    Raises:
        SurgeryError: nothing to do, or a bad input (see interpolate).
    """
    write = write.with_(**changes)
    quiet = write.quiet
    if not save and scorer is None:
        raise SurgeryError("--no-save without -t (a task to score) leaves nothing to do")
    base_ckpt, trained_ckpt = open_input(base), open_input(trained)
    warn_if_swapped(base_ckpt, trained_ckpt)
    plans = [
        plan_interpolate(
            base_ckpt,
            trained_ckpt,
            a,
            layers=layers,
            stack=stack,
            extrapolate=extrapolate,
            modules=modules,
        )
        for a in alphas
    ]  # validates inputs, layers and alphas before anything is written or loaded
    if in_memory is None:
        in_memory = scorer is not None and fits_in_memory(trained_ckpt)
    out_dir = Path(out_dir)
    check_output(out_dir, [base_ckpt.path, trained_ckpt.path], write.force)
    names = point_names(alphas)
    rows = [{"alpha": a} for a in alphas]
    with staged_output(out_dir) as staging:
        if save:
            for step, (plan, name) in enumerate(zip(plans, names, strict=True), 1):
                announce("sweep", step, len(plans), f"writing {name}", quiet or scorer is not None)
                execute(
                    plan,
                    staging / name,
                    quiet=quiet,
                    max_shard_size=write.max_shard_size,
                    extra_files=card_file(plan, staging / name),
                )
        if scorer is not None:
            if in_memory:
                blender = MemoryBlender(base_ckpt, trained_ckpt, scorer.load)
                points = [
                    resolve_alphas(
                        trained_ckpt, a, layers, stack, extrapolate=extrapolate, modules=modules
                    )
                    for a in alphas
                ]
                scores = _memory_scores(blender, points, alphas, scorer, quiet)
            else:
                folders = [staging / (n if save else f".scratch-{n}") for n in names]
                scores = _disk_scores(plans, folders, save, scorer, quiet)
            for row, metrics in zip(rows, scores, strict=True):
                row.update(metrics)
            config = {
                "base": str(base),
                "trained": str(trained),
                "layers": layers,
                "stack": stack,
                "modules": modules,
                "in_memory": in_memory,
                **scorer.config,
            }
            write_results(rows, staging, "sweep", config)
            metrics = metric_names(rows)
            if metrics:
                from surgery.diagnostics.plots import alpha_label, plot_metrics_vs_alpha

                where = f" (layers {layers})" if layers else ""
                plot_metrics_vs_alpha(
                    rows,
                    metrics,
                    staging / "sweep.png",
                    f"Interpolation sweep{where}: {Path(str(trained)).name}",
                    alpha_label(layers, modules),
                )
    return rows


def _memory_scores(
    blender: MemoryBlender, points, alphas, scorer: Scorer, quiet: bool
) -> list[dict]:
    """Score each (LayerValues, disk stack, module filter) point on the in-memory model."""
    scores = []
    for step, (values, disk_stack, modules) in enumerate(points, 1):
        announce("sweep", step, len(points), f"scoring alpha {alphas[step - 1]:g}", quiet)
        memory_stack = blender.stack(disk_stack.name) if disk_stack is not None else None
        blender.set_alphas(values, memory_stack, modules)
        scores.append(scorer(blender.model, blender.tokenizer, progress=not quiet))
    return scores


def _disk_scores(plans, folders, saved: bool, scorer: Scorer, quiet: bool) -> list[dict]:
    """Score each written point (writing scratch checkpoints first when nothing was saved)."""
    scores = []
    for step, (plan, folder) in enumerate(zip(plans, folders, strict=True), 1):
        announce("sweep", step, len(plans), f"scoring {folder.name.lstrip('.')}", quiet)
        if not saved:
            execute(plan, folder, quiet=True, extra_files=card_file(plan, folder))
        model, tokenizer = scorer.load(folder)
        scores.append(scorer(model, tokenizer, progress=not quiet))
        del model
        if not saved:
            shutil.rmtree(folder)
    return scores
