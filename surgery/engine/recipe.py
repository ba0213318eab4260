"""The recipe: how an output was made, stored in every shard's metadata and surgery_recipe.json."""

from __future__ import annotations

from collections.abc import Sequence

from surgery import __version__
from surgery.engine.reader import Checkpoint


def describe_input(role: str, checkpoint: Checkpoint) -> dict[str, str]:
    """An input as the recipe records it: its role, what the user gave, and the Hub revision."""
    entry = {"role": role, "path": checkpoint.spec or str(checkpoint.path)}
    if checkpoint.hub is not None:
        entry |= {"repo_id": checkpoint.hub.repo_id, "revision": checkpoint.hub.revision}
    return entry


def make_recipe(operation: str, inputs: Sequence[tuple[str, Checkpoint]], **params: object) -> dict:
    """A JSON-ready description of an operation: tool, version, inputs by role, parameters.

    Parameters that are None are left out, so a recipe lists only what was asked for.
    """
    recipe: dict[str, object] = {
        "tool": "checkpoint-surgery",
        "version": __version__,
        "operation": operation,
        "inputs": [describe_input(role, ckpt) for role, ckpt in inputs],
    }
    recipe.update({key: value for key, value in params.items() if value is not None})
    return recipe
