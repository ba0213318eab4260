"""Priors a user can name: `--seed-profiles` families, run as the first trials beside the
baselines.

Each family is a few strength profiles (one strength per block of `Space.names`, on its grid),
enqueued like the baselines; a profile a baseline or an earlier seed already holds is dropped.

- `lines`: LiNeS (Wang et al., ICLR 2025) scales layer l's update by a + (b - a) * l / (L - 1)
  (l = 0 .. L-1: `a` at the first layer, `b` at the last). A block takes that line at its mean
  depth (the mean of its layers' strengths, the line being linear); the block outside the
  stack (`*`) takes `a`, as the embeddings sit before the first layer. Grid: a in LINES_A, b in
  LINES_B.
- `reverted`: the paper's middle band (`space.paper_band`) at each strength of REVERTED
  (0 reverts it), the other layers TRAINED's; a block takes the mean of its layers' strengths.
- `localize DIR`: a `surgery localize` run on the same BASE and TRAINED (its localize.json
  records their identity; another pair is refused). Its rows that revert a block fully
  (alpha 0) say, per metric beyond noise, how far reverting the block moves the score from
  TRAINED towards BASE (the recovery r). The benefit of reverting is r where training made the
  metric worse and -r where it made it better (reverting then gives the gain back, or with
  r < 0 improves it further). A layer's benefit is the mean over metrics and over the rows
  whose block holds it; its strength is 1 - clip(benefit, 0, 1) (`localize`), or 0 where the
  benefit is positive and 1 elsewhere (`localize sign`). A block takes the mean of its layers'
  strengths; `*` stays TRAINED's.
- `blocks`: measured, in rounds of probes and a composition (`probes`, then `compose`).
  Round 1 probes, per block b and model m (BASE, and each expert; TRAINED with one expert),
  the uniform Expert Soup (TRAINED with one expert) everywhere but b, which is m alone:
  B * (K + 1) trials. When every probe is complete, the search enqueues their composition:
  per block, the model whose probe improved most on the soup, or the soup's own where none
  did. Each later round (up to ROUNDS) probes the same way around the last composition, until
  a composition changes nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.search.space import EMBEDDINGS, Baseline, Space, paper_band
from surgery.core.errors import SurgeryError
from surgery.core.layers import format_layers, parse_layer_spec

FAMILIES = ("lines", "reverted", "localize", "blocks")
BLOCKS = "blocks"  # the measured family: its probes, then their composition
BASE = "base"  # the model BASE in a probe's name
ROUNDS = 3  # `blocks`'s rounds of probes at most
LINES_A = (0.0, 0.25, 0.5)  # LiNeS's strength at the first layer
LINES_B = (0.75, 1.0)  # and at the last
REVERTED = (0.0, 0.25, 0.5)  # the middle band's strengths


@dataclass(frozen=True)
class Seed(Baseline):
    """A baseline from a named family of priors (`lines`, `reverted`, `localize`)."""

    family: str = ""


def parse_seed(text: str) -> tuple[str, Path | None]:
    """`lines`, `reverted` or `localize DIR` (also `localize=DIR`) -> (family, DIR).

    Raises:
        SurgeryError: another family, a DIR given to lines/reverted, or localize without one.
    """
    family, _, rest = text.strip().replace("=", " ", 1).partition(" ")
    folder = rest.strip() or None
    if family not in FAMILIES:
        raise SurgeryError(
            f"--seed-profiles {text!r}: write one of lines, reverted, blocks, 'localize DIR'"
        )
    if (family == "localize") != (folder is not None):
        wanted = "'localize DIR' (a localize run's folder)" if folder is None else family
        raise SurgeryError(f"--seed-profiles {text!r}: write {wanted}")
    return family, Path(folder) if folder else None


def seeds(
    space: Space, texts: Sequence[str], pair: str, taken: Sequence[Baseline] = ()
) -> list[Seed]:
    """The seed profiles of each `--seed-profiles` text, in order, without those whose
    strengths a baseline in `taken` or an earlier seed holds.

    Args:
        pair: `surgery.diagnostics.localize.pair_identity` of BASE and TRAINED.

    Raises:
        SurgeryError: a bad text, or a localize folder that is unreadable, from another pair
            of models or with no fully reverted block.
    """
    # `blocks` reads its probes back by profile (a baseline's strengths are only the nearest
    # point of the space), so it drops only the profiles a baseline already runs.
    seen = [b.strengths for b in taken]
    profiles = [b.profile for b in taken]
    found: list[Seed] = []
    for text in texts:
        family, folder = parse_seed(text)
        if family == "lines":
            made = lines(space)
        elif family == "reverted":
            made = reverted(space)
        elif family == BLOCKS:
            made = probes(space)
        else:
            made = localized(space, read_localize(folder, pair, space.num_layers))
        for seed in made:
            if (seed.profile if family == BLOCKS else seed.strengths) not in profiles + seen:
                seen.append(seed.strengths)
                profiles.append(seed.profile)
                found.append(seed)
    return found


def _seed(space: Space, family: str, name: str, strengths: dict[str, float]) -> Seed:
    return Seed(name, space.profile(strengths), strengths, family)


def block_strengths(space: Space, layer: Callable[[int], float], outside: float) -> dict:
    """One strength per block: the mean of `layer(i)` over its layers, on the grid; `*` (when
    the space has it) gets `outside`."""
    strengths = {
        f"{start}:{stop}": space.snap(sum(layer(i) for i in range(start, stop)) / (stop - start))
        for start, stop in space.blocks
    }
    if space.embeddings:
        strengths[EMBEDDINGS] = space.snap(outside)
    return strengths


def lines(space: Space) -> list[Seed]:
    """LiNeS's profiles: strength a at the first layer growing linearly to b at the last."""
    last = max(space.num_layers - 1, 1)
    return [
        _seed(
            space,
            "lines",
            f"lines {a:g}-{b:g}",
            block_strengths(space, lambda i, a=a, b=b: a + (b - a) * i / last, a),
        )
        for a in LINES_A
        for b in LINES_B
    ]


def reverted(space: Space) -> list[Seed]:
    """The paper's middle band at each strength of REVERTED, the rest TRAINED."""
    start, stop = paper_band(space.num_layers)
    band = format_layers(list(range(start, stop)))
    return [
        _seed(
            space,
            "reverted",
            f"reverted {band} at {s:g}",
            block_strengths(space, lambda i, s=s: s if start <= i < stop else 1.0, 1.0),
        )
        for s in REVERTED
    ]


def models(space: Space) -> list[str]:
    """The models a probe puts in a block: BASE, then each expert's label (`trained` for one
    expert)."""
    return [BASE, *(space.labels if space.several else ["trained"])]


def block_of(space: Space, block: str, model: str) -> dict[str, float]:
    """A block's parameters when `model` (BASE or an expert's label) holds it alone."""
    if model == BASE:
        return {block: 0.0}
    if not space.several:
        return {block: 1.0}
    shares = {f"{block}@{label}": float(label == model) for label in space.labels}
    return {block: 1.0, **shares}


def soup(space: Space) -> dict[str, float]:
    """The uniform Expert Soup's parameters (TRAINED's with one expert)."""
    return space.complete(dict.fromkeys(space.names, 1.0))


def probe(
    space: Space, block: str, model: str, context: dict[str, float] | None = None
) -> dict[str, float]:
    """The context (the soup by default) with `block` the model's alone."""
    return {**(context or soup(space)), **block_of(space, block, model)}


def probes(space: Space, context: dict[str, float] | None = None, round_: int = 1) -> list[Seed]:
    """A round of `blocks`: per block and model, `probe` in the context (the soup in round 1),
    but the context itself. Named `probe BLOCK MODEL`, after round 1 `probe R BLOCK MODEL`."""
    own = space.profile(context or soup(space))
    found = []
    for block in space.names:
        for model in models(space):
            strengths = probe(space, block, model, context)
            name = f"probe {'' if round_ == 1 else f'{round_} '}{block} {model}"
            if space.profile(strengths) != own:
                found.append(Seed(name, space.profile(strengths), strengths, BLOCKS))
    return found


def compose(
    reference: Sequence[float],
    probed: dict[tuple[str, str], Sequence[float]],
    higher: Sequence[bool],
) -> dict[str, str]:
    """`blocks`'s rule: per block, the model whose probe improved most on the probes' context
    (the soup in round 1), or none (the block stays the context's) where no probe improved.

    A probe's improvement is the sum over objectives of its change from the context, signed
    so that better is positive and divided by the objective's spread (its largest minus its
    smallest value over the context and every probe; an objective with no spread counts 0).

    Args:
        reference: the context's objective values (search half).
        probed: (block, model) -> the probe's objective values.
        higher: per objective, whether higher is better.

    Returns:
        block -> the chosen model, for the blocks where a probe improved.
    """
    rows = [list(reference), *map(list, probed.values())]
    spreads = [max(column) - min(column) for column in zip(*rows, strict=True)]

    def gain(values: Sequence[float]) -> float:
        return sum(
            (v - s) / spread * (1 if up else -1)
            for v, s, spread, up in zip(values, reference, spreads, higher, strict=True)
            if spread > 0
        )

    best: dict[str, tuple[float, str]] = {}
    for (block, model), values in probed.items():
        score = gain(values)
        if score > 0 and score > best.get(block, (0.0, ""))[0]:
            best[block] = (score, model)
    return {block: model for block, (_, model) in best.items()}


def composed(
    space: Space, choice: dict[str, str], context: dict[str, float] | None = None, round_: int = 1
) -> Seed:
    """The profile of `compose`'s choice (`composed R`): the context (the soup in round 1),
    each chosen block its model's alone."""
    strengths = dict(context or soup(space))
    for block, model in choice.items():
        strengths.update(block_of(space, block, model))
    return Seed(f"composed {round_}", space.profile(strengths), strengths, BLOCKS)


def read_localize(folder: Path, pair: str, num_layers: int) -> dict[int, float]:
    """Each layer's benefit of reverting (see the module docstring) from a localize run.

    Raises:
        SurgeryError: no readable localize.json, one from other models, or no row that
            reverts a block fully.
    """
    path = Path(folder) / "localize.json"
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        config, rows = document["config"], document["rows"]
    except (OSError, ValueError, KeyError, TypeError):
        raise SurgeryError(f"--seed-profiles localize {folder}: no localize run there") from None
    recorded = (config.get("inputs") or {}).get("identity")
    if recorded != pair:
        inputs = config.get("inputs") or {}
        made = (
            f"{inputs.get('base')} and {inputs.get('trained')}"
            if recorded
            else "models it does not record"
        )
        raise SurgeryError(
            f"--seed-profiles localize {folder}: it localized {made}, not this BASE and TRAINED"
        )
    benefits: dict[int, list[float]] = {}
    for row in rows:
        if row.get("alpha") != 0:
            continue
        benefit = _benefit(row, config)
        for layer in parse_layer_spec(str(row["block"]), num_layers):
            benefits.setdefault(layer, []).append(benefit)
    if not benefits:
        raise SurgeryError(
            f"--seed-profiles localize {folder}: no row reverts a block fully (alpha 0)"
        )
    return {layer: sum(values) / len(values) for layer, values in benefits.items()}


def _benefit(row: dict[str, Any], config: dict[str, Any]) -> float:
    """The mean over metrics beyond noise of r (made worse in training) or -r (made better);
    0 when no metric has a recovery."""
    improved = set(config.get("improved_in_training", []))
    values = []
    for key, value in row.items():
        if not key.startswith("recovery/") or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            values.append(-value if key.removeprefix("recovery/") in improved else value)
    return sum(values) / len(values) if values else 0.0


def localized(space: Space, benefits: dict[int, float]) -> list[Seed]:
    """`localize` (1 - clipped benefit) and `localize sign` (0 where reverting helps)."""

    def scaled(i: int) -> float:
        return 1.0 - min(max(benefits.get(i, 0.0), 0.0), 1.0)

    def sign(i: int) -> float:
        return 0.0 if benefits.get(i, 0.0) > 0 else 1.0

    return [
        _seed(space, "localize", "localize", block_strengths(space, scaled, 1.0)),
        _seed(space, "localize", "localize sign", block_strengths(space, sign, 1.0)),
    ]


def came_from(attrs: dict[str, Any]) -> str:
    """Where a trial's profile came from, from its user attributes: `baseline NAME`,
    `FAMILY (NAME)` for a seed, or `none` (sampled)."""
    name = attrs.get("baseline")
    if name is None:
        return "none"
    family = attrs.get("family")
    return f"{family} ({name})" if family else f"baseline {name}"
