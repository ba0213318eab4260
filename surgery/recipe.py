"""The recipe: how an output was made, stored in every shard's metadata and surgery_recipe.json."""

from __future__ import annotations

from collections.abc import Sequence

from surgery import __version__
from surgery.reader import Checkpoint


def make_recipe(operation: str, inputs: Sequence[tuple[str, Checkpoint]], **params: object) -> dict:
    """A JSON-ready description of an operation: tool, version, inputs by role, parameters.

    Parameters that are None are left out, so a recipe lists only what was asked for.
    """
    recipe: dict[str, object] = {
        "tool": "checkpoint-surgery",
        "version": __version__,
        "operation": operation,
        "inputs": [{"role": role, "path": str(ckpt.path)} for role, ckpt in inputs],
    }
    recipe.update({key: value for key, value in params.items() if value is not None})
    return recipe
