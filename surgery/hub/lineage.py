"""Which model TRAINED was made from, as its own files say, so that revert and interpolate can
tell a revert to TRAINED's base from a graft of another model's layers (a donor).

TRAINED names its base in its recipe (surgery_recipe.json, or a shard's embedded copy: the
`base` input, or `trained_base` of a graft), in its training record (surgery_train.json) or in
its model card's `base_model` (a local README.md). When none of them names one, nothing is
claimed either way.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from surgery.engine.reader import CARD_NAME, TRAIN_RECORD, Checkpoint
from surgery.hub.resolve import parse_hub_id


def _from_recipe(recipe: dict | None) -> str | None:
    if not isinstance(recipe, dict):
        return None
    if isinstance(recipe.get("trained_base"), str):
        return recipe["trained_base"]
    for entry in recipe.get("inputs") or []:
        if isinstance(entry, dict) and entry.get("role") == "base":
            named = entry.get("repo_id") or entry.get("path")
            return named if isinstance(named, str) else None
    return None


def trained_from(folder: Path | None) -> str | None:
    """The BASE a `surgery train` output was trained from, as its training record in `folder`
    names it; None without a (readable) record."""
    record = folder / TRAIN_RECORD if folder is not None else None
    if record is None or not record.is_file():
        return None
    try:
        base = json.loads(record.read_text()).get("config", {}).get("base")
    except (OSError, ValueError, AttributeError):
        return None
    return base if isinstance(base, str) else None


def _from_card(folder: Path) -> str | None:
    card = folder / CARD_NAME
    if not card.is_file():
        return None
    from huggingface_hub import metadata_load

    try:
        named = (metadata_load(card) or {}).get("base_model")
    except (ValueError, yaml.YAMLError):
        return None  # a malformed card names nothing
    if isinstance(named, list) and len(named) == 1:
        named = named[0]
    return named if isinstance(named, str) else None


def named_base(checkpoint: Checkpoint) -> str | None:
    """The base model `checkpoint`'s recipe, training record or model card names (in that
    order), as written there: a Hub id, a path, or a folder's name; None when none names one."""
    named = _from_recipe(checkpoint.recipe)
    folder = checkpoint.folder
    if named is None and folder is not None:
        named = trained_from(folder) or _from_card(folder)
    return named


def names(named: str, checkpoint: Checkpoint) -> bool:
    """Whether `named` (as `named_base` gives it) is `checkpoint`: the same Hub repository, the
    same folder on disk, or, for a name recorded without its folders (a published recipe), the
    same folder name."""
    hub = parse_hub_id(named)
    if checkpoint.hub is not None and hub is not None and hub[0] == checkpoint.hub.repo_id:
        return True
    path = Path(named)
    if path.exists():
        return path.resolve() == checkpoint.path.resolve()
    if hub is not None and len(path.parts) > 1:
        return named.split("@")[0] == checkpoint.spec.split("@")[0]
    own = checkpoint.hub.repo_id.split("/")[-1] if checkpoint.hub is not None else None
    return path.name in {checkpoint.path.name, own}


def base_role(base: Checkpoint, trained: Checkpoint) -> tuple[str, str | None]:
    """The role BASE plays for TRAINED and the base TRAINED names (None: it names none).

    "donor" when TRAINED names another base than BASE (its layers are grafted), "base"
    otherwise (BASE is TRAINED's base, or nothing says it is not).
    """
    named = named_base(trained)
    if named is None:
        return "base", None
    return ("base" if names(named, base) else "donor"), named
