"""The operations. Each builds a `Plan` (surgery/plan.py); `write_plan` does the rest."""

from __future__ import annotations

from pathlib import Path

from surgery.output_dir import check_output
from surgery.plan import Plan
from surgery.writer import DEFAULT_MAX_SHARD_SIZE, execute


def write_plan(
    plan: Plan,
    out: str | Path,
    *,
    force: bool = False,
    quiet: bool = False,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Check the output path against the plan's inputs, then write the output checkpoint.

    Raises:
        OutputError: OUT is or lies inside an input, contains one, or exists without `force`.
    """
    out = Path(out)
    check_output(out, [ckpt.path for ckpt in plan.inputs], force)
    return execute(plan, out, quiet=quiet, max_shard_size=max_shard_size)
