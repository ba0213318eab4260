"""The Python API of the surgery commands: checkpoint arguments in, a written checkpoint out.

Arguments may be local paths or Hub ids (resolved here, at the edge, before the engine sees
them); every output gets a model card. The engine below (`surgery.engine`) only ever sees opened
local checkpoints and plans.

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
from surgery.engine.reader import CARD_NAME
from surgery.engine.writer import DEFAULT_MAX_SHARD_SIZE, execute
from surgery.hub.model_card import input_license, render_card
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


def card_file(plan: Plan, out: Path) -> dict[str, str]:
    """The model card of the plan's output, as `execute`'s extra file.

    The output keeps the license its config and tokenizer come from declares (recorded in the
    recipe, so `surgery push` regenerates the same card).
    """
    license_id = input_license(plan.files_from.folder)
    if license_id is not None:
        plan.recipe.setdefault("license", license_id)
    return {CARD_NAME: render_card(plan.recipe, title=Path(out).name)}


def revert(
    base: str | Path,
    trained: str | Path,
    out: str | Path,
    layers: str,
    *,
    stack: str | None = None,
    dtype: str | None = None,
    **write_options: object,
) -> Path:
    """Write TRAINED with `layers` taken from BASE to `out`. See `plan_revert` and `write_plan`."""
    plan = plan_revert(open_input(base), open_input(trained), layers, stack=stack, dtype=dtype)
    return write_plan(plan, out, **write_options)


def soup(
    experts: Sequence[str | Path],
    out: str | Path,
    weights: Sequence[float] | None = None,
    *,
    dtype: str | None = None,
    **write_options: object,
) -> Path:
    """Write the (weighted) average of `experts` to `out`. See `plan_soup` and `write_plan`."""
    plan = plan_soup([open_input(p) for p in experts], weights, dtype=dtype)
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
    extrapolate: bool = False,
    **write_options: object,
) -> Path:
    """Write the interpolation of BASE and TRAINED to `out`. See `plan_interpolate`."""
    plan = plan_interpolate(
        open_input(base),
        open_input(trained),
        alpha,
        layers=layers,
        stack=stack,
        dtype=dtype,
        extrapolate=extrapolate,
    )
    return write_plan(plan, out, **write_options)
