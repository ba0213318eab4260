"""The recipe: how an output was made, stored in surgery_recipe.json and in every shard's metadata.

surgery_recipe.json names local inputs by absolute path (so it replays from anywhere); the shards
embed its public copy (`public_recipe`: folder names only), which is what `surgery push`
publishes, so no uploaded byte shows a local path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Sequence
from pathlib import PurePath

from surgery import __version__
from surgery.engine.reader import Checkpoint


def local_path(checkpoint: Checkpoint) -> str:
    """A local input as the files beside an output record it: its absolute path, so a recipe or
    mergekit config replays from any working directory (`surgery push` publishes only the folder's
    name, see `surgery.hub.published`)."""
    return str(checkpoint.path.absolute())


def describe_input(role: str, checkpoint: Checkpoint) -> dict[str, str]:
    """An input as the recipe records it: its role, its Hub id (what the user gave) and revision,
    or its absolute local path."""
    if checkpoint.hub is None:
        return {"role": role, "path": local_path(checkpoint)}
    return {
        "role": role,
        "path": checkpoint.spec or str(checkpoint.path),
        "repo_id": checkpoint.hub.repo_id,
        "revision": checkpoint.hub.revision,
    }


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


def local_inputs(recipe: dict) -> set[str]:
    """The paths of a recipe's local inputs (those without a Hub id), as recorded."""
    return {
        entry["path"]
        for entry in recipe.get("inputs", [])
        if "repo_id" not in entry and isinstance(entry.get("path"), str)
    }


# The folders of an absolute path inside a longer string (a data source `NAME=PATH:SHARE`); not
# a URL's `//host/` nor the `org/name` of a Hub id, which do not start with a lone `/`.
_DIRECTORIES = re.compile(r"(?<![\w.:/~-])/(?:[^/\s:=,;\"']+/)+")


def public_copy(data: object, local: Collection[str] = ()) -> object:
    """JSON or YAML data as it may be published: every local path (an absolute one, one inside a
    longer string, or one of `local` as recorded) becomes its last component, the folder's name.
    Hub ids and URLs are kept.

    A published file must not show the user's file system (user names, project layout); the
    local copies keep full paths, which replay needs.
    """
    if isinstance(data, dict):
        return {key: public_copy(value, local) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [public_copy(item, local) for item in data]
    if isinstance(data, str) and (data in local or os.path.isabs(data)):
        return PurePath(data).name or data
    if isinstance(data, str):
        return _DIRECTORIES.sub("", data)  # `sk=/home/me/sk.jsonl:0.8` -> `sk=sk.jsonl:0.8`
    return data


def public_recipe(recipe: dict) -> dict:
    """The recipe as shards embed it and `surgery push` publishes it (see `public_copy`)."""
    return public_copy(recipe, local_inputs(recipe))
