"""What `surgery search` searches: one strength per block of layers, as an `--alpha` string.

Blocks partition the text stack: `--blocks 4` cuts it into 4 contiguous blocks as equal as
possible, the larger ones first (numpy's `array_split`), or `--blocks 0:9,9:28,28:34` names
them. With `embeddings`, the tensors outside the stack (embeddings, final norm, head) are a
block of their own (`*` in the string); otherwise they stay TRAINED's. Each strength lies in
[0, 1] on a grid of `step` (0 = BASE, 1 = TRAINED, as `surgery interpolate` reads it), so a
profile prints exactly as the `--alpha` string that rebuilds it:
`0:9=0.3,9:28=0,28:34=1,*=0.8`.

With several experts (their families' `labels`), each block also has one share per expert,
named `BLOCK@LABEL` on the same grid: expert k's weight in the block is s * r_k / sum(r) (equal
shares when every r is 0), BASE's 1 - s. Such a profile prints each block's shares after its
strength, `0:9=0.3[1 0.5 0]`, a syntax `eval.search.mix` reads; a block without shares (an
--alpha string: `2:5=0`, `0.5`) splits its strength equally among the experts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal

import numpy as np

from surgery.core.errors import LayerSpecError
from surgery.core.layers import format_layers, parse_layer_spec

EMBEDDINGS = "*"  # the block of the tensors outside the stack, named as in an --alpha string
# The paper's middle band: layers 9:28 of Gemma-3-4B's 34, as a share of any stack.
PAPER_BAND = (9, 28, 34)


@dataclass(frozen=True)
class Space:
    """The blocks of a search and the grid of their strengths.

    Attributes:
        blocks: half-open (start, stop) layer ranges partitioning the stack, in order.
        num_layers: layers of the stack.
        embeddings: whether the tensors outside the stack are a block (`*`).
        step: the grid of strengths, e.g. 0.05.
        labels: the experts' family labels when there are several (a share per block each).
    """

    blocks: tuple[tuple[int, int], ...]
    num_layers: int
    embeddings: bool = False
    step: float = 0.05
    labels: tuple[str, ...] = ()

    @property
    def several(self) -> bool:
        """Whether the space mixes several experts (shares per block)."""
        return len(self.labels) > 1

    @property
    def params(self) -> list[str]:
        """The sampler's parameters, in the order they are suggested: each block's strength,
        then (several experts) each block's share of each expert, `BLOCK@LABEL`."""
        if not self.several:
            return self.names
        return [*self.names, *(f"{n}@{label}" for n in self.names for label in self.labels)]

    def complete(self, strengths: Mapping[str, float]) -> dict[str, float]:
        """A strength profile (block name -> s) as every parameter: missing shares are equal
        (1), so a strength profile is the uniform soup at those strengths."""
        return {name: strengths.get(name, 1.0) for name in self.params}

    @property
    def names(self) -> list[str]:
        """Each block's name, as in an --alpha string: `0:9`, ..., and `*`."""
        names = [f"{start}:{stop}" for start, stop in self.blocks]
        return [*names, EMBEDDINGS] if self.embeddings else names

    def snap(self, value: float) -> float:
        """`value` on the grid, as a short decimal (0.35, not 0.35000000000000003)."""
        steps = round(float(value) / self.step)
        return float(Decimal(str(self.step)) * steps)

    def profile(self, strengths: Mapping[str, float]) -> str:
        """The --alpha string of one strength per block name; with several experts each block's
        shares follow in brackets (`0:9=0.3[1 0.5 0]`)."""
        if not self.several:
            return ",".join(f"{name}={_number(strengths[name])}" for name in self.names)
        return ",".join(
            f"{name}={_number(strengths[name])}"
            f"[{' '.join(_number(strengths[f'{name}@{label}']) for label in self.labels)}]"
            for name in self.names
        )

    def strengths_of(self, alpha: str) -> dict[str, float] | None:
        """The block strengths an --alpha string spells, or None if it is not one strength per
        block of this space (a baseline from outside the space)."""
        parts = dict(item.split("=", 1) for item in alpha.split(",") if "=" in item)
        if list(parts) != self.names:
            return None
        return {name: float(value) for name, value in parts.items()}


def _number(value: float) -> str:
    """A strength as written in a profile: 0, 1, 0.35."""
    return f"{value:g}"


def parse_blocks(text: str, num_layers: int) -> tuple[tuple[int, int], ...]:
    """`4` (numpy's array_split of the stack into 4 blocks) or `0:9,9:28,28:34` (a partition).

    Raises:
        LayerSpecError: a count outside 1..num_layers; a block that is not one contiguous
            range, overlaps another or leaves the stack; layers no block covers.
    """
    text = text.strip()
    if text.isdigit():
        count = int(text)
        if not 1 <= count <= num_layers:
            raise LayerSpecError(
                f"--blocks {count}: give 1 to {num_layers} blocks (the stack has {num_layers} "
                "layers)"
            )
        parts = np.array_split(np.arange(num_layers), count)
        return tuple((int(part[0]), int(part[-1]) + 1) for part in parts)
    blocks, owner = [], {}
    for item in (part.strip() for part in text.split(",")):
        layers = parse_layer_spec(item, num_layers)
        if layers != list(range(layers[0], layers[-1] + 1)):
            raise LayerSpecError(f"--blocks {text}: {item} is not one contiguous range of layers")
        for layer in layers:
            if layer in owner:
                raise LayerSpecError(
                    f"--blocks {text}: {owner[layer]} and {item} overlap at layer {layer}"
                )
            owner[layer] = item
        blocks.append((layers[0], layers[-1] + 1))
    missing = [layer for layer in range(num_layers) if layer not in owner]
    if missing:
        raise LayerSpecError(
            f"--blocks {text}: no block covers layers {format_layers(missing)} of the "
            f"{num_layers}; blocks must partition the stack"
        )
    return tuple(sorted(blocks))


def paper_band(num_layers: int) -> tuple[int, int]:
    """The paper's middle band (9:28 of 34 layers) as the same share of `num_layers`."""
    start, stop, of = PAPER_BAND
    band = (round(num_layers * start / of), round(num_layers * stop / of))
    return band if band[1] > band[0] else (num_layers // 2, num_layers // 2 + 1)


@dataclass(frozen=True)
class Baseline:
    """A point a user would try by hand, run as one of the first trials.

    Attributes:
        name: e.g. `trained`, `reverted 9:28`, `uniform 0.5`.
        profile: its exact --alpha string.
        strengths: the nearest point of the space (the point itself when the space holds it),
            what the optimizer is told was tried.
    """

    name: str
    profile: str
    strengths: dict[str, float]


def baselines(space: Space, band: Sequence[int], uniform: Sequence[float]) -> list[Baseline]:
    """TRAINED, TRAINED with the `band` layers reverted, and each uniform strength (sweep's
    points: every tensor at that strength). With several experts TRAINED is the uniform Expert
    Soup and the reverted point the soup of Expert-Reverted experts; each expert alone and BASE
    follow (`expert_baselines`).

    Args:
        band: the reverted layers (from `--baseline-layers`, or `paper_band`).
        uniform: the uniform strengths.
    """
    ones = dict.fromkeys(space.names, 1.0)
    reverted = set(band)
    near = {
        f"{start}:{stop}": space.snap(
            sum(i not in reverted for i in range(start, stop)) / (stop - start)
        )
        for start, stop in space.blocks
    }
    if space.embeddings:
        near[EMBEDDINGS] = 1.0
    soup = "soup" if space.several else "trained"
    points = [
        Baseline(soup, space.profile(space.complete(ones)), space.complete(ones)),
        Baseline(f"reverted {format_layers(band)}", f"{format_layers(band)}=0", near),
    ]
    for value in uniform:
        near = dict.fromkeys(space.names, space.snap(value))
        points.append(Baseline(f"uniform {_number(value)}", _number(value), near))
    points = [replace(p, strengths=space.complete(p.strengths)) for p in points]
    return [*points, *expert_baselines(space)] if space.several else points


def expert_baselines(space: Space) -> list[Baseline]:
    """Each expert alone (every tensor, those outside the blocks too: `*`) and BASE."""
    points = []
    for label in space.labels:
        shares = " ".join("1" if other == label else "0" for other in space.labels)
        params = {
            name: 1.0 if "@" not in name or name.endswith(f"@{label}") else 0.0
            for name in space.params
        }
        items = [*space.names, *([] if space.embeddings else [EMBEDDINGS])]
        profile = ",".join(f"{name}=1[{shares}]" for name in items)
        points.append(Baseline(f"expert {label}", profile, params))
    base = dict.fromkeys(space.names, 0.0)
    return [*points, Baseline("base", "0", space.complete(base))]
