"""The Python API of the surgery commands: checkpoint arguments in, a written checkpoint out.

Arguments may be local paths or Hub ids (opened here, at the edge, before the engine sees them:
by HTTP range reads, or with `download=True` as a whole snapshot); every output gets a model
card. The engine below (`surgery.engine`) only ever sees opened checkpoints, whose shards not on
disk come with openers of byte sources, and plans.

    from surgery.api import revert
    revert("google/gemma-3-4b-pt", "ckpt/sk-dense", "out", "9:28")
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from surgery.engine.ops.interpolate import plan_interpolate
from surgery.engine.ops.revert import plan_revert
from surgery.engine.ops.soup import plan_soup
from surgery.engine.output_dir import check_output
from surgery.engine.plan import Plan
from surgery.engine.reader import CARD_NAME, Checkpoint
from surgery.engine.writer import DEFAULT_MAX_SHARD_SIZE, execute
from surgery.hub.model_card import render_card
from surgery.hub.resolve import open_input


def write_plan(
    plan: Plan,
    out: str | Path,
    *,
    force: bool = False,
    quiet: bool = False,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Check the output path against the plan's inputs, then write the checkpoint and its card.

    Raises:
        OutputError: OUT is or lies inside an input, contains one, or exists without `force`.
    """
    out = Path(out)
    check_output(out, [ckpt.path for ckpt in plan.inputs], force)
    return execute(
        plan, out, quiet=quiet, max_shard_size=max_shard_size, extra_files=card_file(plan, out)
    )


def _open_inputs(
    specs: Sequence[str | Path], download: bool, files_from: int = -1
) -> list[Checkpoint]:
    """Open the inputs; Hub ids by ranges unless `download`. Only the input the output copies
    config and tokenizer files from (`files_from`) fetches them."""
    index = files_from % max(1, len(specs))
    return [
        open_input(spec, ranges=not download, companions=i == index) for i, spec in enumerate(specs)
    ]


def card_file(plan: Plan, out: Path) -> dict[str, str]:
    """The model card of the plan's output, as `execute`'s extra file."""
    return {CARD_NAME: render_card(plan.recipe, title=Path(out).name)}


def revert(
    base: str | Path,
    trained: str | Path,
    out: str | Path,
    layers: str,
    *,
    stack: str | None = None,
    dtype: str | None = None,
    download: bool = False,
    **write_options: object,
) -> Path:
    """Write TRAINED with `layers` taken from BASE to `out`. See `plan_revert` and `write_plan`.

    Hub ids are read by ranges (only the tensors the plan needs) unless `download`.
    """
    base_ckpt, trained_ckpt = _open_inputs([base, trained], download)
    plan = plan_revert(base_ckpt, trained_ckpt, layers, stack=stack, dtype=dtype)
    return write_plan(plan, out, **write_options)


def soup(
    experts: Sequence[str | Path],
    out: str | Path,
    weights: Sequence[float] | None = None,
    *,
    dtype: str | None = None,
    download: bool = False,
    **write_options: object,
) -> Path:
    """Write the (weighted) average of `experts` to `out`. See `plan_soup` and `write_plan`."""
    plan = plan_soup(_open_inputs(list(experts), download, files_from=0), weights, dtype=dtype)
    return write_plan(plan, out, **write_options)


def interpolate(
    base: str | Path,
    trained: str | Path,
    out: str | Path,
    alpha: str | float,
    *,
    layers: str | None = None,
    stack: str | None = None,
    dtype: str | None = None,
    download: bool = False,
    **write_options: object,
) -> Path:
    """Write the interpolation of BASE and TRAINED to `out`. See `plan_interpolate`."""
    base_ckpt, trained_ckpt = _open_inputs([base, trained], download)
    plan = plan_interpolate(base_ckpt, trained_ckpt, alpha, layers=layers, stack=stack, dtype=dtype)
    return write_plan(plan, out, **write_options)
