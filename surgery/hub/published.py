"""The files beside an output as `surgery push` publishes them: local paths become folder names.

Locally, the recipe, the mergekit config, the training record and eval results name local inputs
by full path, so that they replay from any working directory. Published, a full path would show
the user's file system: each one becomes the folder's name (`surgery.engine.recipe.public_copy`),
as the model card names inputs. The shards need no rewriting: they embed the public recipe.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import yaml

from surgery.core.errors import SurgeryError
from surgery.engine.reader import MERGEKIT_CONFIG_NAME, RECIPE_NAME, RESULTS_NAME, TRAIN_RECORD
from surgery.engine.recipe import local_inputs, public_copy


def _json(data: object) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"


def _yaml(data: object) -> str:
    return yaml.safe_dump(data, sort_keys=False)  # as surgery.mergekit_config.render_config


# Each published text file: how it is read and written back.
_FORMATS: dict[str, tuple[Callable[[str], object], Callable[[object], str]]] = {
    RECIPE_NAME: (json.loads, _json),
    MERGEKIT_CONFIG_NAME: (yaml.safe_load, _yaml),
    TRAIN_RECORD: (json.loads, _json),
    RESULTS_NAME: (json.loads, _json),
}


def _load(path: Path, load: Callable[[str], object]) -> object:
    try:
        return load(path.read_text())
    except (OSError, ValueError, yaml.YAMLError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise SurgeryError(f"{path}: cannot be read ({first}); not pushed") from None


def published_files(folder: Path) -> dict[str, bytes]:
    """The public copies of the folder's recipe, mergekit config, training record and eval
    results (those it has), by file name.

    Raises:
        SurgeryError: one of them is not valid JSON or YAML.
    """
    recipe_path = folder / RECIPE_NAME
    recipe = _load(recipe_path, json.loads) if recipe_path.is_file() else {}
    local = local_inputs(recipe) if isinstance(recipe, dict) else set()
    published = {}
    for name, (load, dump) in _FORMATS.items():
        if (folder / name).is_file():
            published[name] = dump(public_copy(_load(folder / name, load), local)).encode()
    return published
