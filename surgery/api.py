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
from surgery.engine.ops.merge.planner import plan_merge
from surgery.engine.ops.revert import plan_revert
from surgery.engine.ops.soup import plan_soup
from surgery.engine.output_dir import check_output
from surgery.engine.plan import Plan
from surgery.engine.reader import CARD_NAME
from surgery.engine.writer import DEFAULT_MAX_SHARD_SIZE, execute
from surgery.hub.model_card import render_card
from surgery.hub.resolve import open_input
from surgery.mergekit_config import read_config, render_config

MERGEKIT_CONFIG_NAME = "mergekit_config.yml"


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
    """The model card of the plan's output and, when there is one, the equivalent mergekit
    config (mergekit_config.yml), as `execute`'s extra files."""
    files = {CARD_NAME: render_card(plan.recipe, title=Path(out).name)}
    if plan.mergekit_config is not None:
        files[MERGEKIT_CONFIG_NAME] = render_config(plan.mergekit_config)
    return files


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
    **write_options: object,
) -> Path:
    """Write the interpolation of BASE and TRAINED to `out`. See `plan_interpolate`."""
    plan = plan_interpolate(
        open_input(base), open_input(trained), alpha, layers=layers, stack=stack, dtype=dtype
    )
    return write_plan(plan, out, **write_options)


def merge(config: str | Path, out: str | Path, *, seed: int = 0, **write_options: object) -> Path:
    """Run a mergekit YAML config on the streaming engine and write the result to `out`.

    Args:
        config: path of the YAML (mergekit's format; model paths relative to the working
            directory, or Hub ids).
        seed: seed of DARE and DELLA's random masks (recorded in the recipe).

    Raises:
        MergeConfigError: an unsupported method or key, or a config mergekit rejects.
        MismatchError: the models do not line up.
    """
    spec = read_config(config, seed=seed)
    plan = plan_merge(spec, [open_input(model) for model in spec.models])
    return write_plan(plan, out, **write_options)
