"""The comparison's translation outputs: per model, how generations stopped, how many outputs
are empty and how long they are (`eval.kinds.translation_outputs`), read from every translation
unit's samples.

Rows per language (each direction), then pooled over the items of a family's languages and of
a split's languages, for each direction and for all directions together (the reference pools
responses for its group diagnostics the same way). With several few-shot seeds a language's
rows pool every seed's outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eval.kinds.translation_outputs import diagnostics_of_samples
from eval.study.formatting import ALL_DIRECTIONS
from eval.tasks import KINDS

# Rows of one (task, direction) in this order: the split means first, as in the report.
SCOPES = ("overall", "family", "language")


def is_translation(kind: str) -> bool:
    """Whether a kind's units are translations (scored by chrF from logged hypotheses)."""
    registered = KINDS.get(kind)
    return registered is not None and registered.measure == "chrf"


def translation_outputs(runs: list[Any], cells: list[Any]) -> list[dict[str, Any]]:
    """Rows of output diagnostics: per model, task and direction (`variant`), at scope
    `language`, `family` (per split) and `overall` (per split), then the same pooled over the
    task's directions (variant `all directions`) where it has several.

    Args:
        runs: compare's `Run`s (their `lines` of a unit, from a folder or memory); typed
            loosely, since compare imports this module.
        cells: compare's `Cell`s of the base's results.
    """
    cells = [cell for cell in cells if is_translation(cell.kind) and cell.lang]
    rows = []
    for run in runs:
        lines = {
            cell.key: [line for unit in cell.units for line in run.lines(unit)] for cell in cells
        }
        groups: dict[tuple, list[dict[str, Any]]] = {}
        for cell in cells:
            split = cell.split or "others"
            variants = [cell.variant]
            if len({c.variant for c in cells if c.task == cell.task}) > 1:
                variants.append(ALL_DIRECTIONS)
            for variant in variants:
                places = [
                    ("family", cell.family, split, None),
                    ("overall", None, split, None),
                ]
                if variant == cell.variant:
                    places.insert(0, ("language", cell.family, split, cell.lang))
                for place in places:
                    key = (cell.task, variant, *place)
                    groups.setdefault(key, []).extend(lines[cell.key])
        for key in sorted(groups, key=_placement(list(groups))):
            task, variant, scope, family, split, lang = key
            if scope == "family" and family is None:
                continue  # `others` languages belong to no family
            row = {"model": run.name, "task": task, "variant": variant, "scope": scope}
            row.update(family=family, split=split, lang=lang, n=len(groups[key]))
            rows.append(row | diagnostics_of_samples(groups[key]))
    return rows


def _placement(keys: list[tuple]) -> Callable[[tuple], tuple]:
    """The order of rows: by task, direction (in order, all directions last), scope
    (`SCOPES`), then as first met (the suite's order of families and languages)."""
    first = {key: index for index, key in enumerate(keys)}
    variants = [v for v in dict.fromkeys(key[1] for key in keys) if v != ALL_DIRECTIONS]
    variants.append(ALL_DIRECTIONS)
    return lambda key: (key[0], variants.index(key[1]), SCOPES.index(key[2]), first[key])
