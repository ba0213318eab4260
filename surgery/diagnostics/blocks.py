"""Which layers localize reverts together: N equal blocks or explicit slices, consecutive blocks
of a width, sliding windows, or the middle band between first/last boundary counts.

The text is parsed before anything is read (`parse_block_plan`: bad syntax, a stride of 0), and
checked against the stack's layer count from the checkpoint's headers before any model loads
(`BlockPlan.blocks`: a window wider than the stack, boundaries that leave no band).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from surgery.core.errors import LayerSpecError
from surgery.core.layers import format_layers, parse_layer_spec


@dataclass(frozen=True)
class Block:
    """Layers reverted together; `fields` are the extra columns of its rows (a window's
    first layer and its end, a band's first/last counts)."""

    layers: list[int]
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The layers as a spec: `2:4`."""
        return format_layers(self.layers)


@dataclass(frozen=True)
class BlockPlan:
    """One of: `blocks` (slices), `block_size`, `window` (with `stride`), `boundaries`."""

    blocks: str | None = None
    block_size: int | None = None
    window: int | None = None
    stride: int = 1
    boundaries: tuple[tuple[int, int], ...] = ()

    @property
    def mode(self) -> str:
        """`blocks`, `block_size`, `window` or `boundaries`."""
        if self.window is not None:
            return "window"
        if self.boundaries:
            return "boundaries"
        return "blocks" if self.blocks is not None else "block_size"

    def resolve(self, num_layers: int) -> list[Block]:
        """The blocks of a stack of `num_layers` layers, in order.

        Raises:
            LayerSpecError: a slice outside the stack, a window wider than it, or boundaries
                that keep every layer.
        """
        if self.window is not None:
            return sliding_windows(num_layers, self.window, self.stride)
        if self.boundaries:
            return [middle_band(num_layers, first, last) for first, last in self.boundaries]
        if self.block_size is not None:
            return [
                Block(list(range(i, min(i + self.block_size, num_layers))))
                for i in range(0, num_layers, self.block_size)
            ]
        assert self.blocks is not None
        if self.blocks.strip().isdigit():
            return [
                Block(list(range(*block))) for block in equal_blocks(int(self.blocks), num_layers)
            ]
        return [Block(parse_layer_spec(item, num_layers)) for item in self.blocks.split(",")]


def equal_blocks(count: int, num_layers: int) -> list[tuple[int, int]]:
    """`count` contiguous blocks `(start, end)` covering the stack, as equal as possible: the
    first `num_layers % count` one layer longer (numpy's array_split).

    Raises:
        LayerSpecError: a count outside 1..num_layers.
    """
    if not 1 <= count <= num_layers:
        raise LayerSpecError(
            f"--blocks {count}: give 1 to {num_layers} blocks (the stack has {num_layers} layers)"
        )
    size, longer = divmod(num_layers, count)
    starts = [i * size + min(i, longer) for i in range(count + 1)]
    return list(itertools.pairwise(starts))


def parse_block_plan(
    blocks: str | None = None,
    block_size: int | None = None,
    window: int | None = None,
    stride: int | None = None,
    boundaries: str | None = None,
) -> BlockPlan:
    """Check the options' syntax (no checkpoint needed): exactly one way to form blocks.

    Raises:
        LayerSpecError: none or several given, a width or stride below 1, a stride without a
            window, or boundaries that do not parse.
    """
    given = [
        name
        for name, value in (
            ("--blocks", blocks),
            ("--block-width", block_size),
            ("--window", window),
            ("--boundaries", boundaries),
        )
        if value is not None
    ]
    if len(given) != 1:
        raise LayerSpecError(
            "give one of --blocks (N, or slices 0:9,9:28,28:34), --block-width, --window or "
            "--boundaries" + (f", not {' and '.join(given)}" if given else "")
        )
    if stride is not None and window is None:
        raise LayerSpecError("--stride goes with --window")
    for name, value in (("--block-width", block_size), ("--window", window), ("--stride", stride)):
        if value is not None and value < 1:
            raise LayerSpecError(f"{name} must be at least 1, got {value}")
    return BlockPlan(
        blocks=blocks,
        block_size=block_size,
        window=window,
        stride=stride if stride is not None else 1,
        boundaries=parse_boundaries(boundaries) if boundaries is not None else (),
    )


def parse_boundaries(text: str) -> tuple[tuple[int, int], ...]:
    """`9,6;6,6;12,6` -> ((9, 6), (6, 6), (12, 6)): first/last layer counts kept, per band.

    Raises:
        LayerSpecError: an item that is not two counts of 0 or more, or no item.
    """
    pairs = []
    for item in (part.strip() for part in text.split(";")):
        if not item:
            continue
        try:
            first, last = (int(number) for number in item.split(","))
        except ValueError:
            raise LayerSpecError(
                f"--boundaries {text!r}: {item!r} is not FIRST,LAST (e.g. 9,6;6,6)"
            ) from None
        if first < 0 or last < 0:
            raise LayerSpecError(f"--boundaries {text!r}: {item!r} has a negative count")
        pairs.append((first, last))
    if not pairs:
        raise LayerSpecError(f"--boundaries {text!r}: no FIRST,LAST pair (e.g. 9,6;6,6)")
    return tuple(pairs)


def sliding_windows(num_layers: int, width: int, stride: int) -> list[Block]:
    """Windows `[s, s + width)` for s = 0, stride, ... while the window fits in the stack.

    Raises:
        LayerSpecError: the window is wider than the stack.
    """
    if width > num_layers:
        raise LayerSpecError(f"--window {width} is wider than the stack's {num_layers} layers")
    return [
        Block(list(range(start, start + width)), {"start": start, "end": start + width})
        for start in range(0, num_layers - width + 1, stride)
    ]


def middle_band(num_layers: int, first: int, last: int) -> Block:
    """The layers between the first `first` and the last `last`: `[first, num_layers - last)`.

    Raises:
        LayerSpecError: `first + last` leaves no layer between them.
    """
    if first + last >= num_layers:
        raise LayerSpecError(
            f"--boundaries {first},{last}: keeping the first {first} and the last {last} layers "
            f"leaves no band of the stack's {num_layers} layers to revert"
        )
    return Block(list(range(first, num_layers - last)), {"first": first, "last": last})
