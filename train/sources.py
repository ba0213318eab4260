"""Training data sources as the user names them: `[NAME=]LOCATION[:SHARE]` and shares. Parsing
only: reading the data is train/data.py's work, the `--mix-until` curriculum
train/strategies/curriculum.py's."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from surgery.hub.datasets import HUB_PREFIX, parse_dataset_ref
from train.errors import TrainConfigError


@dataclass(frozen=True)
class DataSource:
    """One training corpus: a file, a folder of files, or a Hub dataset, with its share.

    `share` is None until normalized by `normalize_shares`; `until` is the fraction of training
    steps during which the source is mixed in (None: the whole run).
    """

    name: str
    location: str
    share: float | None = None
    hub: bool = False
    until: float | None = None


def _parse_share(text: str, spec: str) -> float:
    try:
        share = float(text)
    except ValueError:
        raise TrainConfigError(
            f"--data {spec!r}: share {text!r} does not parse; write NAME=PATH:SHARE, e.g. "
            "en=data/en.jsonl.gz:0.2"
        ) from None
    if not math.isfinite(share) or share <= 0:
        raise TrainConfigError(f"--data {spec!r}: share must be a positive number, got {text}")
    return share


def _default_name(location: str, index: int) -> str:
    stem = location.rstrip("/").rsplit("/", 1)[-1]
    for suffix in (".jsonl.gz", ".jsonl", ".txt"):
        if stem.endswith(suffix):
            return stem[: -len(suffix)] or f"source{index}"
    return stem or f"source{index}"


def parse_data_source(spec: str, index: int = 0) -> DataSource:
    """Parse `[NAME=]LOCATION[:SHARE]`; LOCATION is a path or `hub:ID[#CONFIG][@SPLIT[@REVISION]]`
    (`surgery.hub.datasets`' grammar, shared with `surgery eval -t`).

    A suffix after the last `:` is a share when it contains no `/`; anything else there is a
    path (so `C:/data` and `hub:` ids survive), unless it is not an existing file either, in
    which case it is reported as a share that does not parse.

    Args:
        spec: the `--data` value.
        index: position among the sources, for a default name.

    Returns:
        The source, share None when not given.

    Raises:
        TrainConfigError: on an empty location or a share that does not parse.
    """
    name, rest = None, spec.strip()
    head, sep, tail = rest.partition("=")
    if sep and re.fullmatch(r"[\w.-]+", head.strip()):
        name, rest = head.strip(), tail.strip()
    hub = rest.startswith(HUB_PREFIX)
    body = rest[len(HUB_PREFIX) :] if hub else rest
    share = None
    location, colon, suffix = body.rpartition(":")
    if colon and "/" not in suffix and not (not hub and Path(body).exists()):
        share = _parse_share(suffix.strip(), spec)
        body = location
    if not body.strip():
        raise TrainConfigError(f"--data {spec!r} names no file or dataset")
    if hub:
        try:
            parse_dataset_ref(HUB_PREFIX + body.strip())
        except ValueError as error:
            raise TrainConfigError(f"--data {spec!r}: {error}") from None
    return DataSource(
        name=name or _default_name(body, index), location=body.strip(), share=share, hub=hub
    )


def normalize_shares(sources: Sequence[DataSource]) -> tuple[DataSource, ...]:
    """Give every source a share summing to 1: all given (rescaled) or none given (equal).

    Raises:
        TrainConfigError: when only some sources have a share, or names repeat.
    """
    names = [s.name for s in sources]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise TrainConfigError(
            f"--data names must be unique; repeated: {', '.join(duplicates)} (use NAME=PATH)"
        )
    given = [s.share is not None for s in sources]
    if any(given) and not all(given):
        raise TrainConfigError("give a share to every --data source or to none (equal shares)")
    shares = [s.share if s.share is not None else 1.0 for s in sources]
    total = sum(shares)
    return tuple(replace(s, share=share / total) for s, share in zip(sources, shares, strict=True))
