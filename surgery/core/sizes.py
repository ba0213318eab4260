"""Byte sizes as people write them: `5GB`, `500MB`, `2GiB`, `80GB`, or a plain byte count."""

from __future__ import annotations

import math

from surgery.core.errors import SurgeryError

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


class SizeError(SurgeryError, ValueError):
    """A size that does not parse, is not finite or is under one byte."""


def parse_size(text: str | int) -> int:
    """Parse a size such as `5GB`, `500MB`, `2GiB` or a byte count into bytes.

    Decimal units (KB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB) of 1024.

    Raises:
        SizeError: an unknown unit, a number that does not parse or is not finite (`inf`,
            `1e400`), or a size below one byte (`0.4` is not 0 bytes).
    """
    if isinstance(text, int):
        if text <= 0:
            raise SizeError(f"size must be positive, got {text}")
        return text
    cleaned = text.strip().upper().replace(" ", "")
    number = cleaned.rstrip("KMGTIB")
    unit = cleaned[len(number) :]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    size = value * _UNITS[unit] if unit in _UNITS else -1.0
    if not 0 < size < math.inf:  # NaN compares false; inf, 1e400 or 1e300GB cannot be counted
        raise SizeError(f"cannot parse size {text!r}; write e.g. 5GB, 500MB or 2GiB")
    count = int(size)
    if count < 1:
        raise SizeError(f"size {text!r} is less than one byte")
    return count


def format_size(count: float) -> str:
    """Bytes in decimal units with three significant figures: 86.2 GB, 512 MB, 0 B."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(count) >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count:.0f} B"
