"""What `surgery search` searches: one strength per block of layers, as an `--alpha` string.

Blocks partition the text stack: `--blocks 4` cuts it into 4 contiguous blocks as equal as
possible, the larger ones first (numpy's `array_split`), or `--blocks 0:9,9:28,28:34` names
them. With `embeddings`, the tensors outside the stack (embeddings, final norm, head) are a
block of their own (`*` in the string); otherwise they stay TRAINED's. Each strength lies in
[0, 1] on a grid of `step` (0 = BASE, 1 = TRAINED, as `surgery interpolate` reads it), so a
profile prints exactly as the `--alpha` string that rebuilds it:
`0:9=0.3,9:28=0,28:34=1,*=0.8`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
    """

    blocks: tuple[tuple[int, int], ...]
    num_layers: int
    embeddings: bool = False
    step: float = 0.05

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
        """The --alpha string of one strength per block name."""
        return ",".join(f"{name}={_number(strengths[name])}" for name in self.names)

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
    points: every tensor at that strength).

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
    points = [
        Baseline("trained", space.profile(ones), ones),
        Baseline(f"reverted {format_layers(band)}", f"{format_layers(band)}=0", near),
    ]
    for value in uniform:
        near = dict.fromkeys(space.names, space.snap(value))
        points.append(Baseline(f"uniform {_number(value)}", _number(value), near))
    return points
